"""The thread that renews a guarded run's lease, and the one timer that starts it late.

:class:`LeaseRenewer` renews the :class:`~leaseguard.renewal.LeaseHandle` it follows every
``renew_every_ms`` on a daemon thread; the guard always stops and joins that thread before the
handler's invocation returns, because Lambda freezes the execution environment as soon as the
handler returns and a frozen renewer would look alive.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leaseguard.renewal import LeaseHandle

_log = logging.getLogger("leaseguard")
# Taken at import: a test that swaps threading.Thread to count renewer threads must not count
# the one timer thread.
_Thread = threading.Thread


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
