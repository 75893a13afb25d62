"""The lease an invocation holds while its handler runs.

:class:`LeaseHandle` is what :func:`leaseguard.current_lease` returns inside a guarded handler;
:class:`leaseguard.renewer.LeaseRenewer` renews it on a thread of its own.
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


# Where the renewer lived before it had a module of its own (it imports nothing from here at
# run time, so importing it last closes no cycle).
from leaseguard.renewer import LeaseRenewer  # noqa: E402

__all__ = ["LeaseHandle", "LeaseRenewer", "NoActiveLease", "current_lease"]
