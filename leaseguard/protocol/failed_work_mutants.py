"""Seeded mutants of the failed-work rules (docs/protocol.md, "Failed work"): the queue's
bound (Q8), a halted key (N1, Q9), the operator's redrive (V1, V3) and the dead-letter bound
(G6, invariant (n)). They are checked at the ``queue`` and ``dead`` bounds; the registry of
every mutant is :data:`leaseguard.protocol.mutants.MUTANTS`."""

from __future__ import annotations

from dataclasses import replace

from leaseguard.types import LeaseResult, Signal

from .model import ProtocolModel
from .state import DEFAULT_MAX_QUEUE, Failure, Full, KeyRecord, Lost, Stored


class MutantModel(ProtocolModel):
    """The base of every model mutant: tokens from 0, not the clock (traces read 1, 2, 3)."""

    def __init__(self) -> None:
        super().__init__(token_floor=lambda now: 0)


class BoundIgnored(MutantModel):
    """A forward is queued however long the queue already is (row Q8 missing)."""

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
        return super().acquire_or_enqueue(rec, sid, record, ttl_ms, nonce, now, 1 << 30, room)


class HaltIgnored(MutantModel):
    """A hand-off grants the head of a halted key's queue (row N1's halt missing)."""

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
        if failure is not None:
            failure = replace(failure, halt=False)
        return super().transfer_to_next(rec, owner, ttl_ms, claim, token, now, failure)


class RedriveDrops(MutantModel):
    """A redrive clears the dead letters without queueing them (row V1 broken)."""

    def redrive(
        self, rec: KeyRecord, ids: tuple[str, ...] | None, now: int, nonce: str | None = None
    ) -> int:
        moved = len(rec.dead)
        rec.dead = []
        rec.halted = False
        return moved


class RedriveForgetsItsCall(MutantModel):
    """A redrive does not recognise its own resend (row V3 missing): a lost reply's resend
    answers as a new call."""

    def redrive(
        self, rec: KeyRecord, ids: tuple[str, ...] | None, now: int, nonce: str | None = None
    ) -> int:
        return super().redrive(rec, ids, now, None)


class DeadPastBound(MutantModel):
    """Dead letters with no bound (the old G6): a key's dead-letter list grows with every
    signal that fails its last attempt."""

    def complete(
        self,
        rec: KeyRecord,
        owner: str,
        now: int,
        failure: Failure | None = None,
        *,
        mark_owner: bool = True,
    ) -> None:
        limit, self.dead_limit = self.dead_limit, 1 << 30
        try:
            super().complete(rec, owner, now, failure, mark_owner=mark_owner)
        finally:
            self.dead_limit = limit


class OverflowDropped(MutantModel):
    """A failure with no room left for its dead letter drops the signal."""

    def no_room(self, rec: KeyRecord, sid: str, stored: Stored, back: list[str]) -> None:
        return


class OverflowNotHalted(MutantModel):
    """A failure with no room left keeps its signal at the head without halting the key: the
    next owner is handed a signal the guard cannot run and no dead letter can take."""

    def no_room(self, rec: KeyRecord, sid: str, stored: Stored, back: list[str]) -> None:
        rec.stored[sid] = stored
        back.append(sid)
