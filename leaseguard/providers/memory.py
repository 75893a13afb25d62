"""Leases and signal queues in this process's memory.

For tests and single-process programs (several threads). Every method holds one lock, so each
step is atomic. Expiry uses :func:`time.monotonic_ns`, which never jumps with the wall clock.

Fencing tokens: ``max(last token + 1, monotonic clock in µs)``. The last token is kept while
the key has an owner or signals, and for :data:`TOKEN_MEMORY_MS` after it went idle; after that
the clock alone is above every token issued earlier, so idle keys can be forgotten.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from leaseguard.contract import LeaseResult
from leaseguard.errors import LeaseLostError
from leaseguard.signals import KeyState, Signal, decode_signal

from .base import BaseLeaseProvider

TOKEN_MEMORY_MS = 60_000
_GC_EVERY = 1024


@dataclass
class _KeyRecord:
    owner: str | None = None
    token: int = 0
    expires_ns: int = 0
    claimed: bool = True
    previous: str | None = None  # who handed over (or released) last: makes retries idempotent
    idle_since_ns: int = 0
    queue: deque[str] = field(default_factory=deque)
    records: dict[str, str] = field(default_factory=dict)
    in_flight: list[str] = field(default_factory=list)


class InMemoryLeaseProvider(BaseLeaseProvider):
    """Thread-safe, single-process provider with the full contract and signal queue."""

    def __init__(self, *, max_payload_bytes: int = 256 * 1024) -> None:
        super().__init__(max_payload_bytes=max_payload_bytes)
        self._lock = threading.Lock()
        self._keys: dict[str, _KeyRecord] = {}
        self._orphan_index: set[str] = set()  # keys with signals queued or in flight
        self._ops = 0

    # -- helpers (called with the lock held) ---------------------------------------------------

    def _record(self, key: str, now: int) -> _KeyRecord:
        self._ops += 1
        if self._ops % _GC_EVERY == 0:
            self._forget_idle(now)
        rec = self._keys.get(key)
        if rec is None:
            rec = self._keys[key] = _KeyRecord()
        elif rec.owner is not None and rec.expires_ns <= now:
            rec.owner = None  # expired: free, but the token is remembered
            rec.idle_since_ns = now
        return rec

    def _forget_idle(self, now: int) -> None:
        horizon = now - TOKEN_MEMORY_MS * 1_000_000
        for key in [
            k
            for k, r in self._keys.items()
            if (r.owner is None or r.expires_ns <= now)
            and not r.queue
            and not r.in_flight
            and r.idle_since_ns < horizon
        ]:
            del self._keys[key]

    @staticmethod
    def _grant(rec: _KeyRecord, owner: str, ttl_ms: int, now: int, claimed: bool) -> int:
        rec.token = max(rec.token + 1, now // 1000)
        rec.owner = owner
        rec.expires_ns = now + ttl_ms * 1_000_000
        rec.claimed = claimed
        return rec.token

    def _sync_index(self, key: str, rec: _KeyRecord) -> None:
        if rec.queue or rec.in_flight:
            self._orphan_index.add(key)
        else:
            self._orphan_index.discard(key)

    @staticmethod
    def _complete(rec: _KeyRecord) -> None:
        for signal_id in rec.in_flight:
            rec.records.pop(signal_id, None)
        rec.in_flight.clear()

    def _free(self, rec: _KeyRecord, owner: str, now: int) -> None:
        rec.owner = None
        rec.previous = owner
        rec.idle_since_ns = now

    def _grant_head(
        self, key: str, rec: _KeyRecord, ttl_ms: int, now: int, claimed: bool, previous: str | None
    ) -> Signal:
        head = rec.queue.popleft()
        token = self._grant(rec, head, ttl_ms, now, claimed)
        rec.previous = previous
        rec.in_flight.append(head)
        self._sync_index(key, rec)
        return decode_signal(head, rec.records[head], token)

    def _requeue_in_flight(self, rec: _KeyRecord) -> None:
        rec.queue.extendleft(reversed(rec.in_flight))
        rec.in_flight.clear()

    # -- the contract ---------------------------------------------------------------------------

    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        with self._lock:
            now = time.monotonic_ns()
            rec = self._record(key, now)
            if rec.owner == owner:
                rec.expires_ns = now + ttl_ms * 1_000_000
                return LeaseResult(True, owner, rec.token)
            if rec.owner is not None:
                return LeaseResult(False, rec.owner, rec.token)
            # A dead owner's signals are not this owner's to complete: back to the queue.
            self._requeue_in_flight(rec)
            token = self._grant(rec, owner, ttl_ms, now, claimed=True)
            rec.previous = None
            return LeaseResult(True, owner, token)

    def _get_owner(self, key: str) -> str | None:
        with self._lock:
            return self._record(key, time.monotonic_ns()).owner

    def _release(self, key: str, owner: str) -> None:
        with self._lock:
            now = time.monotonic_ns()
            rec = self._record(key, now)
            if rec.owner == owner:
                self._complete(rec)
                self._free(rec, owner, now)
                self._sync_index(key, rec)

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        with self._lock:
            now = time.monotonic_ns()
            rec = self._record(key, now)
            if not _holds(rec, owner, token):
                return False
            rec.expires_ns = now + ttl_ms * 1_000_000
            return True

    def _transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        with self._lock:
            now = time.monotonic_ns()
            rec = self._record(key, now)
            if rec.owner == to_owner and rec.previous == from_owner:
                return True
            if rec.owner != from_owner:
                return False
            self._complete(rec)
            self._grant(rec, to_owner, ttl_ms, now, claimed=True)
            rec.previous = from_owner
            self._sync_index(key, rec)
            return True

    # -- the signal queue -----------------------------------------------------------------------

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int
    ) -> LeaseResult:
        with self._lock:
            now = time.monotonic_ns()
            rec = self._record(key, now)
            if rec.owner == signal.id:  # a second delivery of the running signal
                return LeaseResult(False, signal.id, rec.token, position=None)
            if rec.owner is not None:
                if signal.id not in rec.records:
                    rec.records[signal.id] = record
                    rec.queue.append(signal.id)
                    self._sync_index(key, rec)
                    return LeaseResult(False, rec.owner, rec.token, position=len(rec.queue))
                position = _position(rec.queue, signal.id)
                return LeaseResult(False, rec.owner, rec.token, position=position)
            if not rec.queue and not rec.in_flight:
                token = self._grant(rec, signal.id, ttl_ms, now, claimed=True)
                rec.previous = None
                # Kept until the owner completes, so a crash re-delivers it.
                rec.records[signal.id] = record
                rec.in_flight.append(signal.id)
                self._sync_index(key, rec)
                return LeaseResult(True, signal.id, token)
            # The previous owner died with work pending; that work goes first.
            self._requeue_in_flight(rec)
            if signal.id not in rec.records:
                rec.records[signal.id] = record
                rec.queue.append(signal.id)
            head = self._grant_head(key, rec, ttl_ms, now, claimed=True, previous=None)
            return LeaseResult(True, head.id, head.token, adopted=head)

    def _take(self, key: str, owner: str, limit: int, token: int | None = None) -> list[Signal]:
        with self._lock:
            rec = self._record(key, time.monotonic_ns())
            if not _holds(rec, owner, token):
                raise LeaseLostError(key, owner, rec.owner)
            taken: list[Signal] = []
            while rec.queue and len(taken) < limit:
                signal_id = rec.queue.popleft()
                rec.in_flight.append(signal_id)
                taken.append(decode_signal(signal_id, rec.records[signal_id]))
            self._sync_index(key, rec)
            return taken

    def _transfer_to_next(
        self, key: str, owner: str, ttl_ms: int, claim: bool, token: int | None = None
    ) -> Signal | None:
        with self._lock:
            now = time.monotonic_ns()
            rec = self._record(key, now)
            if not _holds(rec, owner, token):
                raise LeaseLostError(key, owner, rec.owner)
            self._complete(rec)
            if not rec.queue:
                self._free(rec, owner, now)
                self._sync_index(key, rec)
                return None
            return self._grant_head(key, rec, ttl_ms, now, claimed=claim, previous=owner)

    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        with self._lock:
            now = time.monotonic_ns()
            rec = self._record(key, now)
            stored = rec.records.get(owner)
            if rec.owner != owner or rec.token != token or rec.claimed or stored is None:
                return None
            rec.claimed = True
            rec.expires_ns = now + ttl_ms * 1_000_000
            return decode_signal(owner, stored, token)

    def _pending(self, key: str) -> int:
        with self._lock:
            rec = self._keys.get(key)
            return len(rec.queue) if rec else 0

    def _adopt(self, ttl_ms: int, limit: int, claim: bool) -> list[tuple[str, Signal]]:
        adopted: list[tuple[str, Signal]] = []
        with self._lock:
            now = time.monotonic_ns()
            for key in list(self._orphan_index):
                if len(adopted) >= limit:
                    break
                rec = self._record(key, now)
                if rec.owner is not None:
                    continue
                self._requeue_in_flight(rec)
                if not rec.queue:
                    self._sync_index(key, rec)
                    continue
                adopted.append(
                    (key, self._grant_head(key, rec, ttl_ms, now, claimed=claim, previous=None))
                )
        return adopted

    def _inspect(self, key: str) -> KeyState:
        with self._lock:
            now = time.monotonic_ns()
            rec = self._record(key, now)
            live = rec.owner is not None
            return KeyState(
                key=key,
                owner=rec.owner,
                token=rec.token if live else None,
                remaining_ms=(rec.expires_ns - now) // 1_000_000 if live else None,
                queued=tuple(decode_signal(s, rec.records[s]) for s in rec.queue),
                in_flight=tuple(rec.in_flight),
            )


def _holds(rec: _KeyRecord, owner: str, token: int | None) -> bool:
    """``owner`` holds the key, and with ``token`` when one is given."""
    return rec.owner == owner and (token is None or rec.token == token)


def _position(queue: deque[str], signal_id: str) -> int | None:
    for index, queued in enumerate(queue):
        if queued == signal_id:
            return index + 1
    return None  # in flight: already delivered to the owner
