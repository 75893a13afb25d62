"""The types every part of leaseguard shares: a leaf module (standard library only).

The lease and the signal queue, as the protocol model (:mod:`leaseguard.protocol.model`), the
providers and the guard all see them: :class:`Signal`, :class:`DeadLetter`, :class:`KeyState`,
:class:`LeaseResult`, the two structural contracts (:class:`LeaseProvider`, :class:`SignalQueue`)
and :class:`QueueProvider`, a backend that implements both with fencing tokens on every
owner-side call. Nothing here imports another leaseguard module, so any module can import it
without a cycle. :mod:`leaseguard.contract` and :mod:`leaseguard.signals` re-export these names
(they are the documented import paths).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

JSONValue = Any
"""A JSON value: dict with str keys, list, str, int, float, bool or None (typed loosely so that
Lambda events, which are ``dict[str, Any]``, need no casts)."""


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch: the one clock signal timestamps, the DynamoDB
    provider's lease deadlines and ``leaseguard inspect`` read."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Signal:
    """One queued event.

    ``id`` identifies it (normally the forwarding invocation's request id): a retried forward
    with the same id is queued once. ``payload`` is any JSON value. ``token`` is set on the
    signal that a provider just made owner (by :meth:`SignalQueue.transfer_to_next`,
    :meth:`SignalQueue.adopt_orphans`, or an adopted :meth:`SignalQueue.acquire_or_enqueue`):
    it is the fencing token of that grant. Queued or taken signals have ``token=None``.
    """

    id: str
    payload: JSONValue
    enqueued_at_ms: int = field(default_factory=now_ms)
    token: int | None = None
    attempts: int = 0
    """How many runs of this signal failed so far (0 on its first delivery)."""


@dataclass(frozen=True)
class DeadLetter:
    """A signal whose handler failed ``attempts`` times: kept on its key with its payload and
    the last error, never run again unless redriven."""

    id: str
    payload: JSONValue
    attempts: int
    error: str
    enqueued_at_ms: int
    failed_at_ms: int


@dataclass(frozen=True)
class KeyState:
    """A snapshot of one key, for ``leaseguard inspect`` and tests."""

    key: str
    owner: str | None
    token: int | None
    remaining_ms: int | None
    queued: tuple[Signal, ...]
    in_flight: tuple[str, ...]
    dead_letters: tuple[DeadLetter, ...] = ()
    halted: bool = False
    """A signal was dead-lettered under ``on_poison="halt"``: nothing queued runs until
    :meth:`~leaseguard.providers.base.BaseLeaseProvider.redrive`."""


LEASE_PROVIDER_METHODS = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


@dataclass(frozen=True)
class LeaseResult:
    """The outcome of an acquire.

    ``owner`` is the holder after the call (the caller when ``acquired``), ``token`` the
    holder's fencing token when known. The queue step
    (:meth:`~leaseguard.signals.SignalQueue.acquire_or_enqueue`) also fills ``position``
    (1-based place of the queued signal, when not acquired) and ``adopted`` (the orphaned
    signal the caller now owns and must run before its own, when acquired) and ``attempts``.
    """

    acquired: bool
    owner: str | None
    token: int | None
    position: int | None = None
    adopted: Signal | None = None
    attempts: int = 0
    """When the caller's own signal was granted: its failed runs so far (a platform retry of an
    event that failed before resumes the count; see ``max_attempts``)."""


@runtime_checkable
class LeaseProvider(Protocol):
    """The structural lease contract. Check with :func:`is_lease_provider`, not isinstance:
    a backend from another package need not import this class."""

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult: ...

    def get_lease_owner(self, key: str) -> str | None: ...

    def release_lease(self, key: str, owner: str) -> None: ...

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool: ...

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool: ...


def is_lease_provider(obj: object) -> bool:
    """True when ``obj`` has all five contract methods as callables (four is not enough)."""
    return all(callable(getattr(obj, name, None)) for name in LEASE_PROVIDER_METHODS)


@runtime_checkable
class SignalQueue(Protocol):
    """The queue steps. Each is one atomic step on the backend."""

    def acquire_or_enqueue(self, key: str, signal: Signal, ttl_ms: int) -> LeaseResult:
        """Free key: ``signal.id`` becomes owner (``acquired=True``). Held key: the signal is
        appended to the key's queue (``acquired=False``, ``owner`` = holder, ``position`` =
        1-based place in the queue). The same ``signal.id`` is queued once; a signal already in
        flight (it owns the key, or its owner took it) is not queued again (``position=None``).
        The new owner's signal is kept in flight until it completes, so it is delivered again if
        the owner dies. A key whose owner died with signals queued is adopted:
        ``signal`` is queued behind them, the head becomes owner and is returned as
        ``adopted`` (the caller runs it first, keeping FIFO order)."""
        ...

    def take_signals(
        self, key: str, owner: str, limit: int, *, token: int | None = None
    ) -> list[Signal]:
        """Pop up to ``limit`` queued signals, oldest first, for the owner to handle inline.
        A non-owner gets :class:`~leaseguard.errors.LeaseLostError`. With ``token``, only the
        grant with that fencing token counts as the owner (an owner id can own a key again
        after its signal was re-delivered)."""
        ...

    def transfer_to_next(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        claim: bool = True,
        token: int | None = None,
        error: str | None = None,
        requeue_owner: bool = True,
        max_attempts: int = 3,
    ) -> Signal | None:
        """Complete the owner's work and hand the lease to the head of the queue (its ``id``
        becomes owner with a new token, returned as ``signal.token``), or release the key when
        the queue is empty, in one step. A non-owner gets ``LeaseLostError``; nothing changes.

        ``claim=True`` means the caller runs the returned signal itself; ``claim=False`` leaves
        the grant to be claimed once by :meth:`claim_signal` in the invocation it is sent to.
        ``token`` as in :meth:`take_signals`. ``error`` reports a failed run: every signal the
        owner holds goes back to the head of the queue with one more attempt, or to the key's
        dead letters at ``max_attempts``; ``requeue_owner=False`` leaves the owner's own signal
        to the platform's retry (docs/protocol.md, row G6). A provider whose class sets
        ``partial_reports`` (every built-in one) also takes ``completed=`` and ``failed=``,
        a partial report (row G8), which the guard's ``drain_batch`` needs."""
        ...

    def claim_signal(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        """Called by the invocation that received a handoff envelope: returns the stored signal
        (and refreshes the lease) only if ``owner`` holds the key with exactly ``token`` and no
        one claimed this grant before; else ``None`` and nothing changes. The payload comes
        from the backend, never from the envelope."""
        ...

    def pending_signals(self, key: str) -> int:
        """How many signals wait in the key's queue (not counting ones in flight)."""
        ...

    def adopt_orphans(
        self, ttl_ms: int, limit: int, *, claim: bool = False
    ) -> list[tuple[str, Signal]]:
        """For up to ``limit`` keys whose owner's lease expired with signals queued or in
        flight: put in-flight signals back at the head, make the head owner and return it.
        Uses an index of such keys, never a scan of all keys."""
        ...

    def inspect_key(self, key: str) -> KeyState:
        """Owner, token, remaining TTL and queue of a key (a read, for operators)."""
        ...


def is_signal_queue(obj: object) -> bool:
    """True when ``obj`` has every :class:`SignalQueue` method as a callable."""
    return all(callable(getattr(obj, name, None)) for name in SIGNAL_QUEUE_METHODS)


SIGNAL_QUEUE_METHODS = (
    "acquire_or_enqueue",
    "take_signals",
    "transfer_to_next",
    "claim_signal",
    "pending_signals",
    "adopt_orphans",
    "inspect_key",
)


@runtime_checkable
class QueueProvider(LeaseProvider, SignalQueue, Protocol):
    """A lease provider that also implements the signal queue (every built-in one does). Its
    owner-side calls take the grant's fencing token (``token=``), renewals too: after a
    takeover the same owner id can hold a key again under a newer grant, and only the token
    tells the two apart. A forward can carry its own queue bound (``max_queue=``, row Q8)."""

    def acquire_or_enqueue(
        self, key: str, signal: Signal, ttl_ms: int, *, max_queue: int | None = None
    ) -> LeaseResult: ...

    def renew_lease(
        self, key: str, owner: str, ttl_ms: int, *, token: int | None = None
    ) -> bool: ...
