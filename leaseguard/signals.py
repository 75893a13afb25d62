"""Signals: events that arrived for a key while another invocation owned it.

The queue lives next to the lease and every step changes both at once, which is what rules out
the lost wakeup (a forwarder enqueueing just after the owner found the queue empty and left).
The steps are the :class:`SignalQueue` methods; every provider that ships with leaseguard
implements them.

Lifecycle of a signal on a key::

    acquire_or_enqueue ──► queued ──► transfer_to_next / adopt_orphans ──► owner (in flight)
                              │                                               │
                              └──► take_signals ──► in flight ─────────────────┤
                                                                              ▼
                               completed when its owner calls transfer_to_next or release_lease

A signal stays in the backend until the owner that received it completes. If that owner dies
first (its lease expires), :meth:`SignalQueue.adopt_orphans` puts every in-flight signal back at
the head of the queue, so delivery is at least once; without crashes it is exactly once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .validation import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload

if TYPE_CHECKING:
    from .contract import LeaseResult

JSONValue = Any
"""A JSON value: dict with str keys, list, str, int, float, bool or None (typed loosely so that
Lambda events, which are ``dict[str, Any]``, need no casts)."""


def now_ms() -> int:
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


def encode_signal(signal: Signal, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """The stored form: ``{"at": <ms>, "p": <payload>}``. Payload size is checked on the payload
    alone so the limit a user configures is the limit their events meet."""
    body = encode_payload(signal.payload, max_payload_bytes)
    return f'{{"at":{int(signal.enqueued_at_ms)},"p":{body}}}'


def decode_signal(
    signal_id: str, stored: str | bytes, token: int | None = None, attempts: int = 0
) -> Signal:
    record = json.loads(stored)
    return Signal(
        id=signal_id,
        payload=record["p"],
        enqueued_at_ms=record["at"],
        token=token,
        attempts=attempts,
    )


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
        to the platform's retry (docs/protocol.md, row G6)."""
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
