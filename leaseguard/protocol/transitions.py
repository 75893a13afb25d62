"""The G rows of docs/protocol.md, which every step of :class:`~leaseguard.protocol.model.
ProtocolModel` is made of: a lease running out and old memories forgotten (G1, G2), a grant and
the queue head's grant (G3, G4), a dead owner's work requeued (G5), a completion, whole or
partial, with its dead letters (G6, G8), and a release (G7). The steps themselves (the rows a
caller names: L*, Q*, K*, N*, C*, D*) are in :mod:`.model`, the operator's (V*) in
:mod:`.operators`."""

from __future__ import annotations

from collections.abc import Callable

from leaseguard.types import Signal

from .operators import OperatorSteps
from .state import (
    MAX_ERROR_CHARS,
    DeadEntry,
    Done,
    Failure,
    KeyRecord,
    Stored,
)


class Transitions(OperatorSteps):
    """The G rows, shared by every step. Subclasses (the explorer's mutants) override one to
    break one rule."""

    token_floor: Callable[[int], int]
    done_limit: int
    dead_limit: int

    def observe(self, rec: KeyRecord, now: int) -> None:
        """[G1] A lease whose deadline passed is free (its token is kept); [G2] completed ids
        older than the dedupe window are forgotten, and so is the last redrive's memory (V3)."""
        if rec.owner is not None and rec.expires <= now:
            rec.owner = None
            rec.idle_since = now
        if rec.done:
            horizon = now - self.dedupe_window_ms
            for sid in [s for s, d in rec.done.items() if d.at <= horizon]:
                del rec.done[sid]
        if rec.redriven is not None and rec.redriven.at <= now - self.dedupe_window_ms:
            rec.redriven = None

    def grant(
        self,
        rec: KeyRecord,
        owner: str,
        ttl_ms: int,
        now: int,
        *,
        claimed: bool,
        nonce: str | None,
        prev: str | None,
        prev_token: int | None,
    ) -> int:
        """[G3] A new owner: the token goes up, never below the clock floor."""
        rec.token = max(rec.token + 1, self.token_floor(now))
        rec.owner = owner
        rec.expires = now + ttl_ms
        rec.claimed = claimed
        rec.grant_nonce = nonce
        rec.prev = prev
        rec.prev_token = prev_token
        rec.take_nonce = None
        rec.take_count = 0
        return rec.token

    def grant_head(
        self,
        rec: KeyRecord,
        ttl_ms: int,
        now: int,
        *,
        claimed: bool,
        nonce: str | None,
        prev: str | None,
        prev_token: int | None,
    ) -> Signal:
        """[G4] The head of the queue becomes owner and stays in flight until it completes."""
        head = rec.queue.pop(0)
        self.grant(
            rec, head, ttl_ms, now, claimed=claimed, nonce=nonce, prev=prev, prev_token=prev_token
        )
        rec.in_flight.append(head)
        return rec.signal(head, rec.token)

    def requeue_in_flight(self, rec: KeyRecord) -> None:
        """[G5] A dead owner's in-flight signals go back to the head of the queue, in order,
        each with one more attempt when a run of it started and never finished (a handler
        that crashes its process every time is dead-lettered like one that raises, see the
        guard). An unclaimed grant's signal (``c`` false: its envelope never claimed it)
        never started: it keeps its count."""
        unstarted = rec.in_flight[0] if rec.in_flight and not rec.claimed else None
        for sid in rec.in_flight:
            if sid != unstarted:
                rec.stored[sid].attempts += 1
        rec.queue[0:0] = rec.in_flight
        rec.in_flight = []

    def remember_done(
        self, rec: KeyRecord, sid: str, token: int, now: int, ok: bool, attempts: int = 0
    ) -> None:
        rec.done.pop(sid, None)
        rec.done[sid] = Done(token, now, ok, attempts)
        while len(rec.done) > self.done_limit:
            del rec.done[next(iter(rec.done))]

    def no_room(self, rec: KeyRecord, sid: str, stored: Stored, back: list[str]) -> None:
        """[G6] A failure would dead-letter ``sid`` on a key that holds ``dead_limit`` dead
        letters already: failed work is never dropped, so it goes back to the head of the queue
        with its count (the owner's own event too) and the key halts until a redrive (V1)
        makes room."""
        rec.stored[sid] = stored
        back.append(sid)
        rec.halted = True

    def complete(
        self,
        rec: KeyRecord,
        owner: str,
        now: int,
        failure: Failure | None = None,
        *,
        mark_owner: bool = True,
    ) -> None:
        """[G6] The owner finished: its in-flight signals are done (remembered for dedupe), or,
        after a failure, retried at the head of the queue or dead-lettered (at most
        ``dead_limit`` per key: then :meth:`no_room`); [G8] a partial report says which.
        ``mark_owner``: ``transfer_to_next`` remembers its owner's id and
        token (N4 knows a resend by it); release and transfer do not (no signal owns them)."""
        token = rec.token
        back: list[str] = []
        own_attempts = 0
        for sid in rec.in_flight:
            stored = rec.stored.pop(sid)
            verdict = failure.verdict(sid) if failure else "ok"
            if failure is None or verdict == "ok":
                self.remember_done(rec, sid, token, now, ok=True)
                continue
            attempts = stored.attempts + (verdict == "failed")  # [G8] unrun: its count kept
            if verdict == "failed" and attempts >= failure.max_attempts:
                if len(rec.dead) < self.dead_limit:
                    error = failure.error[:MAX_ERROR_CHARS]
                    rec.dead.append(DeadEntry(sid, stored.record, attempts, error, now))
                    rec.halted = rec.halted or failure.halt
                    continue
                self.no_room(rec, sid, Stored(stored.record, attempts), back)
            elif sid != owner or failure.requeue_owner or verdict == "unrun":
                rec.stored[sid] = Stored(stored.record, attempts)
                back.append(sid)
            else:
                # The invocation's own event: the platform retries it, and that retry resumes
                # the count (Q1/Q2 read it back from the done memory).
                own_attempts = attempts
        # The owner's own step is remembered either way: a resend of it must be recognised
        # after a newcomer overwrote p/pt (a failed one is not deduplicated).
        if mark_owner:
            ok = failure is None or failure.verdict(owner) == "ok"
            self.remember_done(rec, owner, token, now, ok=ok, attempts=own_attempts)
        rec.queue[0:0] = back
        rec.in_flight = []

    def free(self, rec: KeyRecord, owner: str, now: int) -> None:
        """[G7] Released (not expired): ``expires`` is 0, so a released key with signals queued
        is a lost wakeup the explorer reports."""
        rec.prev, rec.prev_token = owner, rec.token
        rec.owner = None
        rec.expires = 0
        rec.grant_nonce = None
        rec.take_nonce = None
        rec.take_count = 0
        rec.idle_since = now
