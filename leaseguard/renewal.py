"""The lease an invocation holds while its handler runs, and the thread that renews it.

:class:`LeaseHandle` is what :func:`leaseguard.current_lease` returns inside a guarded handler.
:class:`LeaseRenewer` renews it every ``renew_every_ms`` on a daemon thread; the guard always
stops and joins that thread before the handler's invocation returns, because Lambda freezes the
execution environment as soon as the handler returns and a frozen renewer would look alive.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from leaseguard.errors import LeaseguardError, LeaseLostError

if TYPE_CHECKING:
    from leaseguard.types import QueueProvider, Signal

_log = logging.getLogger("leaseguard")
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
    ) -> None:
        """``sent_at`` is when the request that granted the lease was *sent*
        (:func:`time.monotonic`): the backend started the TTL no earlier, so counting from the
        reply instead would let a slow reply stretch this process's belief past the backend's
        deadline (docs/protocol.md, invariant (a))."""
        self.provider = provider
        self.key = key
        self.owner = owner
        self.token = token
        self.ttl_ms = ttl_ms
        self.lost_reason: str | None = None
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._valid_until = (time.monotonic() if sent_at is None else sent_at) + ttl_ms / 1000
        self.taken: list[Signal] = []
        # A take_signals call that failed may have moved signals in flight that the handler
        # never saw: the run then ends as failed, which retries them instead of completing.
        self.take_failed = False

    @property
    def lost(self) -> bool:
        """True once a renewal failed or was refused, or once the TTL has run out since the
        last successful renewal was sent (a renewal stuck in client retries does not count).
        A plain read: ``on_lost`` fires from the renewer, or from :meth:`settle`."""
        return self.lost_reason is not None or time.monotonic() >= self._valid_until

    def settle(self) -> bool:
        """After the run: a lease that ran out with no renewal to say so is marked lost now
        (``on_lost`` fires once). Returns :attr:`lost`."""
        if self.lost_reason is None and time.monotonic() >= self._valid_until:
            self.mark_lost("no renewal succeeded within the TTL")
        return self.lost

    @property
    def remaining_ms(self) -> int:
        """Time until the lease would expire as far as this process knows: measured from when
        the last successful renewal was *sent*, so it never overstates the backend's TTL."""
        return max(int((self._valid_until - time.monotonic()) * 1000), 0)

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
            self.mark_lost("take_signals found the lease owned by someone else")
            raise
        except Exception:
            self.take_failed = True
            raise
        self.taken.extend(taken)
        return taken

    def renewed(self, sent_at: float) -> None:
        with self._lock:
            self._valid_until = max(self._valid_until, sent_at + self.ttl_ms / 1000)

    def mark_lost(self, reason: str) -> None:
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


class LeaseRenewer:
    """Renews ``handle`` every ``every_ms`` until stopped or the lease is lost."""

    def __init__(self, handle: LeaseHandle, every_ms: int) -> None:
        self.handle = handle
        self.every_s = every_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"leaseguard-renew-{handle.key[:32]}", daemon=True
        )

    def start(self) -> LeaseRenewer:
        self._thread.start()
        return self

    def _run(self) -> None:
        handle = self.handle
        while not self._stop.wait(self.every_s):
            sent_at = time.monotonic()
            try:
                still_owner = handle.provider.renew_lease(
                    handle.key, handle.owner, handle.ttl_ms, token=handle.token
                )
            except Exception as exc:
                handle.mark_lost(f"renewal failed: {type(exc).__name__}: {exc}")
                return
            if not still_owner:
                handle.mark_lost("renewal refused: the lease expired or moved to another owner")
                return
            handle.renewed(sent_at)

    def stop(self) -> None:
        """Stop and join, waiting at most one renewal period (and at least 1 s). A renewal
        still stuck in client retries after that can only be refused: it names this grant's
        token, which the hand-off or release that follows retires (and the handle is marked
        lost, so nothing is handed off on its account)."""
        self._stop.set()
        if not self._thread.is_alive():
            return
        self._thread.join(max(self.every_s, 1.0))
        if self._thread.is_alive():
            _log.warning("a renewal of %r is still in flight after stop", self.handle.key)
            self.handle.mark_lost("a renewal was still in flight when the run ended")
