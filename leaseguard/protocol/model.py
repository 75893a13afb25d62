"""The lease + signal-queue protocol as one executable model: pure Python, no I/O, time passed in.

Each step of ``docs/protocol.md`` is one method of :class:`ProtocolModel`, acting on one key's
:class:`KeyRecord` at time ``now`` (milliseconds). This is the only place the transitions are
written in Python: :class:`~leaseguard.providers.memory.InMemoryLeaseProvider` runs on it, the
Redis scripts and the DynamoDB expressions implement the same rows (each names its row), the
differential suite (``tests/test_differential.py``) compares every backend's replies and states
with it, and :mod:`leaseguard.protocol.explore` checks it exhaustively under faults.

Row names used in comments (``[A1]`` ...) are the rows of the step table in docs/protocol.md.
"""

from __future__ import annotations

from collections.abc import Callable

from leaseguard.types import LeaseResult, Signal

from .state import (
    DEAD_LIMIT,
    DEDUPE_WINDOW_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_QUEUE,
    DONE_LIMIT,
    MAX_ERROR_CHARS,
    TOKEN_MEMORY_MS,
    DeadEntry,
    Done,
    Failure,
    Full,
    KeyRecord,
    Lost,
    Stored,
    dead_letter,
)
from .transitions import Transitions

# The state's names stay importable from here, where the guard and the providers import them.
__all__ = ["DEDUPE_WINDOW_MS", "DEFAULT_MAX_ATTEMPTS", "ProtocolModel", "clock_floor"]
__all__ += ["DEFAULT_MAX_QUEUE", "DONE_LIMIT", "MAX_ERROR_CHARS", "TOKEN_MEMORY_MS", "Failure"]
__all__ += ["DEAD_LIMIT"]
__all__ += ["DeadEntry", "Done", "Full", "KeyRecord", "Lost", "Stored", "dead_letter"]


def clock_floor(now_ms: int) -> int:
    """Tokens never fall below the clock in microseconds (see docs/design.md, Tokens)."""
    return now_ms * 1000


class ProtocolModel(Transitions):
    """The steps (the rows they are made of, G*, in :mod:`.transitions`; the operator's, V*,
    in :mod:`.operators`). Subclasses (the explorer's
    mutants) override one step to break one rule."""

    # What a Redis failover keeps (the explorer's failover bound): with replicas=N, every write
    # whose reply a caller received (docs/safety.md, section 4)
    failover_keeps_acknowledged = True

    def __init__(
        self,
        *,
        token_floor: Callable[[int], int] = clock_floor,
        dedupe_window_ms: int = DEDUPE_WINDOW_MS,
        done_limit: int = DONE_LIMIT,
        dead_limit: int = DEAD_LIMIT,
    ) -> None:
        self.token_floor = token_floor
        self.dedupe_window_ms = dedupe_window_ms
        self.done_limit = done_limit
        self.dead_limit = dead_limit

    # -- the lease contract (rows L*) -----------------------------------------------------------

    def acquire_lease(self, rec: KeyRecord, owner: str, ttl_ms: int, now: int) -> LeaseResult:
        self.observe(rec, now)
        if rec.owner == owner:  # [L1] the owner again: new deadline, same token
            rec.expires = now + ttl_ms
            return LeaseResult(True, owner, rec.token)
        if rec.owner is not None:  # [L2] refused, naming the holder
            return LeaseResult(False, rec.owner, rec.token)
        self.requeue_in_flight(rec)  # [L3] a dead owner's signals are not this owner's
        token = self.grant(
            rec, owner, ttl_ms, now, claimed=True, nonce=None, prev=None, prev_token=None
        )
        return LeaseResult(True, owner, token)

    def get_owner(self, rec: KeyRecord, now: int) -> str | None:
        self.observe(rec, now)
        return rec.owner

    def release(self, rec: KeyRecord, owner: str, now: int) -> bool:
        self.observe(rec, now)
        if rec.owner != owner:  # [L5] not the owner (or a resend of an applied release)
            return False
        self.complete(rec, owner, now, mark_owner=False)  # [L4]
        self.free(rec, owner, now)
        return True

    def renew(self, rec: KeyRecord, owner: str, ttl_ms: int, token: int | None, now: int) -> bool:
        self.observe(rec, now)
        if not rec.holds(owner, token):  # [R2] never brings back an expired lease
            return False
        rec.expires = now + ttl_ms  # [R1]
        return True

    def transfer_lease(
        self, rec: KeyRecord, from_owner: str, to_owner: str, ttl_ms: int, now: int
    ) -> bool:
        self.observe(rec, now)
        if rec.owner == to_owner and rec.prev == from_owner:  # [T3] resend of an applied one
            return True
        if rec.owner != from_owner:  # [T2]
            return False
        token = rec.token
        self.complete(rec, from_owner, now, mark_owner=False)  # [T1]
        self.grant(
            rec, to_owner, ttl_ms, now, claimed=True, nonce=None, prev=from_owner, prev_token=token
        )
        return True

    # -- the signal queue (rows Q*) -------------------------------------------------------------

    def acquire_or_enqueue(
        self,
        rec: KeyRecord,
        sid: str,
        record: str,
        ttl_ms: int,
        nonce: str,
        now: int,
        max_queue: int = DEFAULT_MAX_QUEUE,
        room: int | None = None,
    ) -> LeaseResult | Full:
        """``room``: how many signals the backend's storage leaves room for in the queue, if
        it bounds them below ``max_queue`` (DynamoDB's lease item: ``Lease.queue_bound``);
        None where nothing but ``max_queue`` does. It is an input of the step, not state:
        the model has no sizes, and the differential suite gives it the room the DynamoDB
        side judged at that step."""
        self.observe(rec, now)
        if rec.owner is not None and rec.grant_nonce == nonce and rec.owner in rec.stored:
            return rec.granted(sid)  # [Q7] a resend of this applied call (its signal not done: K1)
        holder, token = rec.owner, (rec.token if rec.owner is not None else None)
        done = rec.done.get(sid)
        if (done is not None and done.ok) or any(d.id == sid for d in rec.dead):
            return LeaseResult(False, holder, token)  # [Q5] completed or dead-lettered already
        if holder == sid:
            return LeaseResult(False, holder, token)  # [Q4] a second delivery of the owner
        known = sid in rec.stored
        if holder is not None and known:  # [Q3] queued (its place) or in flight (no place)
            position = rec.queue.index(sid) + 1 if sid in rec.queue else None
            return LeaseResult(False, holder, token, position=position)
        if holder is None and not rec.has_work and not rec.halted:
            if room is not None and room < 1:
                return Full(None, 0, sized=True)  # [Q8] no room to store even the granted one
            # [Q1] free: the signal owns the key and stays in flight
            self.grant(rec, sid, ttl_ms, now, claimed=True, nonce=nonce, prev=None, prev_token=None)
            rec.stored[sid] = rec.stored_new(sid, record)
            rec.in_flight.append(sid)
            return rec.granted(sid)
        bound = max_queue if room is None else min(max_queue, room)
        if not known and len(rec.queue) >= bound:
            # [Q8] the queue is at its bound: refused
            return Full(holder, len(rec.queue), sized=bound < max_queue)
        if holder is not None:
            rec.stored[sid] = rec.stored_new(sid, record)  # [Q2] queued behind the holder
            rec.queue.append(sid)
            return LeaseResult(False, holder, token, position=len(rec.queue))
        # Free with work pending. [Q9] halted: queued behind the dead letter, nothing runs.
        # [Q6] orphaned: the dead owner's work first, this signal behind it, the head owns.
        self.requeue_in_flight(rec)
        if sid not in rec.stored:
            rec.stored[sid] = rec.stored_new(sid, record)
            rec.queue.append(sid)
        if rec.halted:
            return LeaseResult(False, None, None, position=rec.queue.index(sid) + 1)
        self.grant_head(rec, ttl_ms, now, claimed=True, nonce=nonce, prev=None, prev_token=None)
        return rec.granted(sid)

    def take(
        self,
        rec: KeyRecord,
        owner: str,
        limit: int,
        token: int | None,
        nonce: str,
        now: int,
        completed: tuple[str, ...] = (),
    ) -> list[Signal] | Lost:
        self.observe(rec, now)
        if not rec.holds(owner, token):
            return Lost(rec.owner)  # [K3]
        if rec.take_nonce == nonce:  # [K2] a resend: the same batch
            ids = rec.in_flight[len(rec.in_flight) - rec.take_count :] if rec.take_count else []
        else:  # [K1]
            # what ran and succeeded since the last report is done before the next is
            # taken, so a crash after this step neither runs nor charges it again (G5)
            for sid in [sid for sid in rec.in_flight if sid in completed]:
                rec.in_flight.remove(sid)
                del rec.stored[sid]
                self.remember_done(rec, sid, rec.token, now, ok=True)
            ids = rec.queue[:limit]
            del rec.queue[:limit]
            rec.in_flight.extend(ids)
            rec.take_nonce, rec.take_count = nonce, len(ids)
        return [rec.signal(sid) for sid in ids]

    def transfer_to_next(
        self,
        rec: KeyRecord,
        owner: str,
        ttl_ms: int,
        claim: bool,
        token: int | None,
        now: int,
        failure: Failure | None = None,
    ) -> Signal | Lost | None:
        self.observe(rec, now)
        if not rec.holds(owner, token):
            # [N4] a resend of a step that was applied: we handed over or released last, or our
            # grant is remembered as completed.
            if rec.prev == owner and (token is None or rec.prev_token == token):
                if rec.owner is None:
                    return None  # we released it
                if rec.owner in rec.in_flight:  # the head our hand-off granted
                    return rec.signal(rec.owner, rec.token)
            done = rec.done.get(owner)
            if token is not None and done is not None and done.token == token:
                return None
            return Lost(rec.owner)  # [N5]
        grant_token = rec.token
        self.complete(rec, owner, now, failure)
        if not rec.queue or rec.halted:  # [N1] nothing queued (or halted): released
            self.free(rec, owner, now)
            return None
        # [N2] / [N3] the head owns the key now, claimed by the caller or left to a claim
        return self.grant_head(
            rec, ttl_ms, now, claimed=claim, nonce=None, prev=owner, prev_token=grant_token
        )

    def claim(
        self, rec: KeyRecord, owner: str, token: int, ttl_ms: int, nonce: str, now: int
    ) -> Signal | None:
        self.observe(rec, now)
        if rec.owner == owner and rec.grant_nonce == nonce and owner in rec.stored:
            return rec.signal(owner, rec.token)  # [C1]/[C4] again: a resend of it
        if (
            rec.owner is None
            and rec.token == token
            and rec.in_flight[:1] == [owner]
            and not rec.halted
        ):
            # [C4] the grant's lease ran out with its signal still in flight (the receiver
            # that claimed it died, or the envelope came late): a retry of the envelope runs
            # it again under a new token, one more attempt counted (G5).
            self.requeue_in_flight(rec)
            return self.grant_head(
                rec, ttl_ms, now, claimed=True, nonce=nonce, prev=None, prev_token=None
            )
        if rec.owner != owner or rec.token != token or owner not in rec.stored:
            return None  # [C3] stale, forged, or the grant moved on
        if rec.claimed:
            return None  # [C2] claimed before by another call (a duplicate envelope)
        rec.claimed, rec.grant_nonce = True, nonce  # [C1]
        rec.expires = now + ttl_ms
        return rec.signal(owner, token)

    def adopt(
        self, rec: KeyRecord, ttl_ms: int, claim: bool, nonce: str, now: int
    ) -> Signal | None:
        self.observe(rec, now)
        if rec.owner is not None:
            if rec.grant_nonce == nonce:  # [D3] a resend of this adoption
                return rec.signal(rec.owner, rec.token)
            return None  # [D2] the owner is alive
        if rec.halted:
            return None  # [D4] halted: nothing runs until a redrive
        self.requeue_in_flight(rec)
        if not rec.queue:
            return None
        # [D1] the head of the dead owner's work owns the key
        return self.grant_head(
            rec, ttl_ms, now, claimed=claim, nonce=nonce, prev=None, prev_token=None
        )
