"""The lease an invocation holds while its handler runs, and the thread that renews it.

:class:`LeaseHandle` is what :func:`leaseguard.current_lease` returns inside a guarded handler.
:class:`LeaseRenewer` renews it every ``renew_every_ms`` on a daemon thread; the guard always
stops and joins that thread before the handler's invocation returns, because Lambda freezes the
execution environment as soon as the handler returns and a frozen renewer would look alive.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from leaseguard.errors import LeaseguardError, LeaseLostError

if TYPE_CHECKING:
    from leaseguard.types import QueueProvider, Signal

_log = logging.getLogger("leaseguard")
# Taken at import: a test that swaps threading.Thread to count renewer threads must not count
# the one timer thread.
_Thread = threading.Thread
_CURRENT: contextvars.ContextVar[LeaseHandle] = contextvars.ContextVar("leaseguard_lease")


class NoActiveLease(LeaseguardError, LookupError):
    """``current_lease()`` was called outside a handler guarded by ``@lease_owned``."""


@contextmanager
def lease_scope(handle: LeaseHandle) -> Iterator[LeaseHandle]:
    """While inside, :func:`current_lease` answers ``handle`` (the guard's handler runs)."""
    reset = _CURRENT.set(handle)
    try:
        yield handle
    finally:
        _CURRENT.reset(reset)


def current_lease() -> LeaseHandle:
    """The lease of the guarded handler that is running now."""
    try:
        return _CURRENT.get()
    except LookupError:
        raise NoActiveLease(
            "current_lease() is only available inside a @lease_owned handler"
        ) from None


class LeaseHandle:
    """One owner's hold on one key for one handler run.

    ``lost`` turns true when a renewal fails or is refused; from then on the handler must not
    assume it is the only one working on the key (check ``token`` in downstream writes, or call
    :meth:`check` before side effects).

    Owner-side calls name the grant by ``token``, not only by the owner id: after a takeover
    the same id can own the key again (its signal was delivered again), and this handle must
    then be refused.

    What a handler uses: :attr:`key`, :attr:`owner` (the signal that runs), :attr:`token` (the
    fencing token), :attr:`lost` and :attr:`lost_reason`, :attr:`remaining_ms`,
    :meth:`check` and :meth:`take_signals`. The rest is the guard's and the renewer's.
    """

    def __init__(
        self,
        provider: QueueProvider,
        key: str,
        owner: str,
        token: int | None,
        ttl_ms: int,
        on_lost: Callable[[LeaseHandle], None] | None = None,
        *,
        sent_at: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sent_at`` is when the request that granted the lease was *sent* (``clock()``,
        :func:`time.monotonic` unless the guard was given another clock, as the model checker
        gives it): the backend started the TTL no earlier, so counting from the reply instead
        would let a slow reply stretch this process's belief past the backend's deadline
        (docs/protocol.md, invariant (a))."""
        self.provider = provider
        self.key = key
        self.owner = owner
        self.token = token
        self.ttl_ms = ttl_ms
        self.lost_reason: str | None = None
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self.clock = clock
        self._valid_until = (clock() if sent_at is None else sent_at) + ttl_ms / 1000
        self.taken: list[Signal] = []
        # A take_signals call that failed may have moved signals in flight that the handler
        # never saw: the run then ends as failed, and its report sends those back unrun.
        self.take_failed = False

    @property
    def grant_owner(self) -> str:
        """The owner of the grant this run holds: :attr:`owner` itself, except inside a batch
        drain, where the item runs under the batch owner's grant
        (:class:`leaseguard.guard.drain.ItemLease`)."""
        return self.owner

    @property
    def lost(self) -> bool:
        """True once a renewal failed or was refused, or once the TTL has run out since the
        last successful renewal was sent (a renewal stuck in client retries does not count).
        A plain read: ``on_lost`` fires from the renewer, or from the guard once the run ends."""
        return self.lost_reason is not None or self.clock() >= self._valid_until

    def _settle(self) -> bool:
        """After the run: a lease that ran out with no renewal to say so is marked lost now
        (``on_lost`` fires once). Returns :attr:`lost`. ``_valid_until`` is the clock time
        until which this grant is certainly held: its TTL counted from when the grant, or the
        last renewal that succeeded, was *sent*."""
        if self.lost_reason is None and self.clock() >= self._valid_until:
            self._mark_lost("no renewal succeeded within the TTL")
        return self.lost

    # The guard's own bookkeeping, public before 0.2: still there, each with a warning.
    @property
    def valid_until(self) -> float:
        """Deprecated: :attr:`remaining_ms` says how long the lease is certainly held."""
        _deprecated("valid_until", "remaining_ms")
        return self._valid_until

    def settle(self) -> bool:
        """Deprecated: the guard's; read :attr:`lost`."""
        _deprecated("settle()", "lost")
        return self._settle()

    def renewed(self, sent_at: float) -> None:
        """Deprecated: the renewer's."""
        _deprecated("renewed()", None)
        self._renewed(sent_at)

    def mark_lost(self, reason: str) -> None:
        """Deprecated: the guard's and the renewer's."""
        _deprecated("mark_lost()", None)
        self._mark_lost(reason)

    @property
    def remaining_ms(self) -> int:
        """Time until the lease would expire as far as this process knows: measured from when
        the last successful renewal was *sent*, so it never overstates the backend's TTL."""
        return max(int((self._valid_until - self.clock()) * 1000), 0)

    def check(self) -> None:
        """Raise :class:`~leaseguard.errors.LeaseLostError` unless the lease is still held."""
        if self.lost:
            raise LeaseLostError(self.key, self.owner)

    def take_signals(self, limit: int = 10) -> list[Signal]:
        """Drain up to ``limit`` follow-up signals queued for this key, oldest first. They are
        this owner's to handle: if it dies before finishing, they are delivered again."""
        try:
            taken = self.provider.take_signals(self.key, self.owner, limit, token=self.token)
        except LeaseLostError:
            self._mark_lost("take_signals found the lease owned by someone else")
            raise
        except Exception:
            self.take_failed = True
            raise
        self.taken.extend(taken)
        return taken

    def _renewed(self, sent_at: float) -> None:
        with self._lock:
            self._valid_until = max(self._valid_until, sent_at + self.ttl_ms / 1000)

    def _mark_lost(self, reason: str) -> None:
        with self._lock:
            if self.lost_reason is not None:
                return
            self.lost_reason = reason
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:  # a failing callback must not kill the renewer or the handler
                _log.exception("on_lost callback failed for key %r", self.key)

    def __repr__(self) -> str:
        reason = self.lost_reason or "the TTL ran out"
        state = f"lost: {reason}" if self.lost else f"{self.remaining_ms} ms left"
        return f"<LeaseHandle key={self.key!r} owner={self.owner!r} token={self.token} {state}>"


def _deprecated(name: str, instead: str | None) -> None:
    import warnings

    use = f": use LeaseHandle.{instead}" if instead else " (it is the guard's own)"
    warnings.warn(f"LeaseHandle.{name} is deprecated{use}", DeprecationWarning, stacklevel=3)


class LeaseRenewer:
    """Renews the lease it follows every ``every_ms`` until paused, stopped or the lease is lost.

    One renewer serves a whole chain of runs: :meth:`follow` points it at each run's lease and
    :meth:`pause` lets go of it before the hand-off, so an owner draining its queue inline does
    not start a thread per run (that cost more than the run itself on a busy key). The thread
    starts when the first renewal falls due, which most invocations on a busy key never reach:
    until then the renewer waits in one shared timer's queue (:class:`_DeferredStarts`). The
    thread ends with :meth:`stop`, which the guard calls before the invocation returns; a
    renewer stopped before its thread started never gets one.
    """

    def __init__(self, handle: LeaseHandle | None, every_ms: int) -> None:
        self.handle = handle
        self.every_s = every_ms / 1000
        self._cond = threading.Condition()
        self._due = time.monotonic() + self.every_s
        self._renewing: LeaseHandle | None = None  # the lease a renewal is in flight for
        self._last: LeaseHandle | None = None  # the lease followed last
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Its place in the timer's queue until its thread starts (None: not waiting there).
        self._deferred: list[LeaseRenewer | None] | None = None

    def start(self) -> LeaseRenewer:
        """Start renewing the handle given to the constructor."""
        if self.handle is not None:
            self.follow(self.handle)
        return self

    def follow(self, handle: LeaseHandle) -> None:
        """Renew ``handle`` from now on, the first time ``every_ms`` from now; a handle it
        followed last keeps its due time (a batch drain's runs share their owner's grant, and
        following each of them must not put its renewal off)."""
        with self._cond:
            if handle is not self._last:
                self._due = time.monotonic() + self.every_s
            self.handle = self._last = handle
            # No notify: an idle thread wakes every period anyway, always before this due
            # time, and waking it here would cost a context switch per run of a chain. No
            # thread yet either: most runs end before their first renewal is due.
            if self._thread is None and self._deferred is None:
                self._deferred = _DEFERRED_STARTS.add(self, self._due)

    def _first_renewal_due(self) -> None:
        """Called by the timer thread once the first renewal may be due: starts the renewing
        thread if the chain is still running, or waits again if a new run put the due time off.
        """
        with self._cond:
            self._deferred = None
            if self._stopping or self._thread is not None or self.handle is None:
                return  # ended, or paused: the next follow() registers again
            if time.monotonic() < self._due:
                self._deferred = _DEFERRED_STARTS.add(self, self._due)
                return
            handle = self.handle
            thread = threading.Thread(
                target=self._run, name=f"leaseguard-renew-{handle.key[:32]}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as exc:  # no thread to be had: say so rather than lapse quietly
                self.handle = None
                failure = f"the renewal thread could not start: {exc}"
            else:
                self._thread = thread
                return
        handle._mark_lost(failure)  # outside the lock: on_lost is the user's code

    def pause(self) -> None:
        """Stop renewing the followed lease, waiting for a renewal in flight at most one renewal
        period (and at least 1 s). A renewal still stuck in client retries after that can only
        be refused: it names this grant's token, which the hand-off or release that follows
        retires (and the handle is marked lost, so nothing is handed off on its account)."""
        with self._cond:
            self.handle = None
            deadline = time.monotonic() + max(self.every_s, 1.0)
            while self._renewing is not None and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            stuck = self._renewing
        if stuck is not None:
            _log.warning("a renewal of %r is still in flight after stop", stuck.key)
            stuck._mark_lost("a renewal was still in flight when the run ended")

    def stop(self) -> None:
        """:meth:`pause`, then end the thread (joined unless a renewal is stuck in flight)."""
        self.pause()
        with self._cond:
            self._stopping = True
            if self._deferred is not None:
                self._deferred[0] = None  # the timer drops it without keeping it alive
                self._deferred = None
            self._cond.notify_all()
            thread, stuck = self._thread, self._renewing
        if thread is not None and stuck is None:
            thread.join(max(self.every_s, 1.0))

    def _next(self) -> LeaseHandle | None:
        """The lease to renew once its renewal is due; ``None`` when stopping."""
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                if self.handle is not None and now >= self._due:
                    self._renewing = self.handle
                    return self.handle
                self._cond.wait(self.every_s if self.handle is None else self._due - now)
            return None

    def _run(self) -> None:
        while (handle := self._next()) is not None:
            self._renew_once(handle)

    def _renew_once(self, handle: LeaseHandle) -> None:
        """One renewal of ``handle``, and what its reply means for the handle and the next due
        time (the renewal thread's whole job; the model checker calls it when its search says
        the renewal is due)."""
        sent_at = handle.clock()
        failure = None
        try:
            if not handle.provider.renew_lease(
                handle.key, handle.owner, handle.ttl_ms, token=handle.token
            ):
                failure = "renewal refused: the lease expired or moved to another owner"
        except Exception as exc:
            failure = f"renewal failed: {type(exc).__name__}: {exc}"
        # Recorded before the renewal counts as finished: pause() returns once it is, and
        # the flow then reads `lost` to decide whether to hand off.
        if failure is None:
            handle._renewed(sent_at)
        else:
            handle._mark_lost(failure)
        with self._cond:
            self._renewing = None
            if self.handle is handle:
                if failure is None:
                    self._due = sent_at + self.every_s
                else:
                    self.handle = None  # a lost lease is not renewed again
            self._cond.notify_all()


class _DeferredStarts:
    """One timer thread per process that starts each renewer's thread when its first renewal
    falls due.

    Starting and joining a thread per invocation cost more than a run on a busy key (about
    150 µs; bench/hot_key.py), and an invocation that ends before its first renewal (a third of
    the TTL by default) never needed one. Registering costs a heap push under a lock; a
    renewer that stops first only clears its slot. The timer sleeps until the earliest due time
    of a renewer still waiting, so a registration due no earlier than that, which is every one
    while the renewers share a period, does not wake it, and neither does a renewer that
    stopped: runs back to back wake it about twice a period, not once a run.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Also after a fork: the child has no timer thread and none of the parent's renewers.
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, list[LeaseRenewer | None]]] = []
        self._order = itertools.count()
        self._wakes_at = math.inf  # while the timer waits: when it wakes next
        self._thread: threading.Thread | None = None

    def add(self, renewer: LeaseRenewer, due: float) -> list[LeaseRenewer | None]:
        """Queue ``renewer`` until ``due`` (:func:`time.monotonic`); returns its slot, which
        the renewer clears to withdraw."""
        slot: list[LeaseRenewer | None] = [renewer]
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._order), slot))
            if self._thread is None or not self._thread.is_alive():  # first use, or it died
                self._thread = _Thread(target=self._run, name="leaseguard-timer", daemon=True)
                self._thread.start()
            elif due < self._wakes_at:
                self._cond.notify()
        return slot

    def _run(self) -> None:
        while True:
            with self._cond:
                renewer = self._next_due()
            try:
                renewer._first_renewal_due()
            except Exception:  # the timer must outlive any one renewer's failure
                _log.exception("starting the renewal thread of %r failed", renewer.handle)

    def _next_due(self) -> LeaseRenewer:
        heap = self._heap
        while True:
            # Withdrawn renewers (stopped before their due time: nearly all) are dropped
            # before the timer decides how long to sleep, so it never wakes for one: on a busy
            # key it then wakes about once a period, not once an invocation.
            while heap and heap[0][2][0] is None:
                heapq.heappop(heap)
            now = time.monotonic()
            if heap and heap[0][0] <= now:
                renewer = heapq.heappop(heap)[2][0]
                if renewer is not None:  # (stopped since the check above: it says no itself)
                    self._wakes_at = now  # busy, not waiting: an add() need not notify
                    return renewer
                continue
            self._wakes_at = heap[0][0] if heap else math.inf
            self._cond.wait(None if self._wakes_at == math.inf else self._wakes_at - now)


_DEFERRED_STARTS = _DeferredStarts()
os.register_at_fork(after_in_child=_DEFERRED_STARTS._reset)
