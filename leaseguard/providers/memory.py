"""Leases and signal queues in this process's memory: the protocol model itself, behind a lock.

For tests and single-process programs (several threads). Every step is one call of
:class:`~leaseguard.protocol.model.ProtocolModel` under one lock, so memory *is* the model
that docs/protocol.md describes and the other backends are compared with. Time is
:func:`time.monotonic_ns` in milliseconds (it never jumps with the wall clock), or ``clock``.

Fencing tokens: ``max(last token + 1, clock in µs)``. An idle key is forgotten
:data:`~leaseguard.protocol.model.TOKEN_MEMORY_MS` after it went idle; the clock alone is then
above every token issued earlier.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from leaseguard.errors import LeaseLostError, QueueFull
from leaseguard.protocol.model import (
    DEAD_LIMIT,
    DEFAULT_MAX_QUEUE,
    Failure,
    Full,
    KeyRecord,
    Lost,
    ProtocolModel,
)
from leaseguard.types import KeyState, LeaseResult, Signal
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES

from .base import BaseLeaseProvider, new_nonce

_GC_EVERY = 1024
T = TypeVar("T")
Step = Callable[[KeyRecord, int, str], T]
"""One protocol step on one key: ``(record, now, nonce) -> reply``."""


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class InMemoryLeaseProvider(BaseLeaseProvider):
    """Thread-safe, single-process provider with the full contract and signal queue.

    ``clock`` returns milliseconds (default: the monotonic clock); tests pass one they move.
    """

    def __init__(
        self,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_queue: int = DEFAULT_MAX_QUEUE,
        clock: Callable[[], int] | None = None,
        model: ProtocolModel | None = None,
        dead_limit: int = DEAD_LIMIT,
    ) -> None:
        super().__init__(
            max_payload_bytes=max_payload_bytes, max_queue=max_queue, dead_limit=dead_limit
        )
        self.model = model or ProtocolModel(dead_limit=self.dead_limit)
        self._clock = clock or _monotonic_ms
        self._lock = threading.Lock()
        self._keys: dict[str, KeyRecord] = {}
        self._orphan_index: set[str] = set()  # keys with signals queued or in flight
        self._dead_index: set[str] = set()  # keys with dead letters
        self._ops = 0
        # The room a sized storage would leave for a forward of (key, signal id), given to the
        # model's Q8 as ``room``: memory stores without a size bound and leaves this None; the
        # differential suite sets it to the room its DynamoDB side judged at the same step, so
        # that item-size refusals are compared with the model's.
        self.storage_room: Callable[[str, str], int | None] | None = None

    def _open(self, key: str) -> tuple[KeyRecord, int]:
        """The key's record (created empty) and the time; call with the lock held."""
        now = int(self._clock())
        self._ops += 1
        if self._ops % _GC_EVERY == 0:
            self._forget_idle(now)
        rec = self._keys.get(key)
        if rec is None:
            rec = self._keys[key] = KeyRecord(idle_since=now)
        return rec, now

    def _forget_idle(self, now: int) -> None:
        """Drop the records the model has forgotten by ``now``. Each is observed first, as a
        step on it would be: a record whose owner's lease ran out, or whose completed ids are
        older than the dedupe window, is forgettable only once that is applied (without it a
        key that ever completed a signal was kept for the life of the process)."""
        idle = []
        for key, rec in self._keys.items():
            self.model.observe(rec, now)
            if rec.forgettable(now):
                idle.append(key)
        for key in idle:
            del self._keys[key]

    def tracked_keys(self) -> int:
        """How many keys' records this provider holds (idle ones are forgotten as the model
        says: :attr:`~leaseguard.protocol.model.TOKEN_MEMORY_MS` after they fell idle, with no
        completion remembered)."""
        with self._lock:
            return len(self._keys)

    def _step(self, key: str, op: str, args: tuple[object, ...], apply: Step[T]) -> T:
        """Apply one protocol step to ``key``'s record, atomically: ``apply(record, now,
        nonce)`` is the model's step with this call's arguments. ``op`` and ``args`` name the
        step for a subclass that schedules steps instead of applying them at once (the model
        checker, :mod:`leaseguard.protocol.guarded`, applies and answers each one when its
        search says so)."""
        with self._lock:
            rec, now = self._open(key)
            result = apply(rec, now, new_nonce())
            self._index(key, rec)
            return result

    def _index(self, key: str, rec: KeyRecord) -> None:
        if rec.has_work:
            self._orphan_index.add(key)
        else:
            self._orphan_index.discard(key)
        if rec.dead:
            self._dead_index.add(key)
        else:
            self._dead_index.discard(key)

    # -- the contract ---------------------------------------------------------------------------

    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        model = self.model
        return self._step(
            key,
            "acquire_lease",
            (owner,),
            lambda rec, now, nonce: model.acquire_lease(rec, owner, ttl_ms, now),
        )

    def _get_owner(self, key: str) -> str | None:
        model = self.model
        return self._step(
            key, "get_lease_owner", (), lambda rec, now, nonce: model.get_owner(rec, now)
        )

    def _release(self, key: str, owner: str) -> None:
        model = self.model
        self._step(
            key, "release_lease", (owner,), lambda rec, now, nonce: model.release(rec, owner, now)
        )

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        model = self.model
        return self._step(
            key,
            "renew_lease",
            (owner, token),
            lambda rec, now, nonce: model.renew(rec, owner, ttl_ms, token, now),
        )

    def _transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        model = self.model
        return self._step(
            key,
            "transfer_lease",
            (from_owner, to_owner),
            lambda rec, now, nonce: model.transfer_lease(rec, from_owner, to_owner, ttl_ms, now),
        )

    # -- the signal queue -----------------------------------------------------------------------

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        model = self.model
        room = self.storage_room(key, signal.id) if self.storage_room is not None else None
        result = self._step(
            key,
            "acquire_or_enqueue",
            (signal.id,),
            lambda rec, now, nonce: model.acquire_or_enqueue(
                rec, signal.id, record, ttl_ms, nonce, now, max_queue, room
            ),
        )
        if isinstance(result, Full):
            why = f"its storage has room for {room} queued signals" if result.sized else None
            raise QueueFull(key, result.depth, max_queue, result.holder, why)
        return result

    def _take(
        self,
        key: str,
        owner: str,
        limit: int,
        token: int | None = None,
        completed: tuple[str, ...] = (),
    ) -> list[Signal]:
        model = self.model
        taken = self._step(
            key,
            "take_signals",
            (owner, token),
            lambda rec, now, nonce: model.take(rec, owner, limit, token, nonce, now, completed),
        )
        if isinstance(taken, Lost):
            raise LeaseLostError(key, owner, taken.holder)
        return list(taken)

    def _transfer_to_next(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        claim: bool,
        token: int | None = None,
        failure: Failure | None = None,
    ) -> Signal | None:
        model = self.model
        nxt = self._step(
            key,
            "transfer_to_next",
            (owner, token, claim, failure),
            lambda rec, now, nonce: model.transfer_to_next(
                rec, owner, ttl_ms, claim, token, now, failure
            ),
        )
        if isinstance(nxt, Lost):
            raise LeaseLostError(key, owner, nxt.holder)
        return nxt

    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        model = self.model
        return self._step(
            key,
            "claim_signal",
            (owner, token),
            lambda rec, now, nonce: model.claim(rec, owner, token, ttl_ms, nonce, now),
        )

    def _pending(self, key: str) -> int:
        with self._lock:
            rec = self._keys.get(key)
            return len(rec.queue) if rec else 0

    def _orphan_keys(self) -> list[str]:
        """The keys an adoption pass visits: those with signals queued or in flight."""
        with self._lock:
            return list(self._orphan_index)

    def _adopt(self, ttl_ms: int, limit: int, claim: bool) -> list[tuple[str, Signal]]:
        # One step per key, as on Redis and DynamoDB: each key's adoption is atomic.
        model = self.model
        adopted: list[tuple[str, Signal]] = []
        for key in self._orphan_keys():
            if len(adopted) >= limit:
                break
            signal = self._step(
                key,
                "adopt_orphans",
                (claim,),
                lambda rec, now, nonce: model.adopt(rec, ttl_ms, claim, nonce, now),
            )
            if signal is not None:
                adopted.append((key, signal))
        return adopted

    def _inspect(self, key: str) -> KeyState:
        with self._lock:
            rec, now = self._open(key)
            state = self.model.inspect(rec, key, now)
        if not state.dead_letters or self._clock is not _monotonic_ms:
            return state
        # Model times are monotonic; a dead letter's time is for people: epoch ms. Rounded up
        # from nanoseconds: two clocks floored to ms apart could put it a millisecond before
        # the signal's own (wall-clock) enqueue time.
        shift = -(-(time.time_ns() - time.monotonic_ns()) // 1_000_000)
        dead = tuple(replace(d, failed_at_ms=d.failed_at_ms + shift) for d in state.dead_letters)
        return replace(state, dead_letters=dead)

    def _redrive(self, key: str, ids: tuple[str, ...] | None) -> int:
        model = self.model
        return self._step(
            key, "redrive", (ids,), lambda rec, now, nonce: model.redrive(rec, ids, now, nonce)
        )

    def _dead_letter_keys(self, limit: int) -> list[str]:
        with self._lock:
            return sorted(self._dead_index)[:limit]

    # -- for the differential suite and the explorer ----------------------------------------------

    def record(self, key: str) -> KeyRecord:
        """A copy of the key's record as the model holds it (tests compare backends with it)."""
        with self._lock:
            rec, now = self._open(key)
            self.model.observe(rec, now)
            return rec.clone()


__all__ = ["InMemoryLeaseProvider"]
