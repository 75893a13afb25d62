"""Seeded mutants: each breaks one rule of the protocol, and the explorer must catch every one.

A mutant that survives means the invariants (or the bounds) cannot see that rule, so
``make model-check`` fails when any mutant goes uncaught.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from leaseguard.types import LeaseResult, Signal

from .bounds import ClientRules
from .model import ProtocolModel
from .state import DEFAULT_MAX_QUEUE, Failure, Full, KeyRecord, Lost, Stored


class _Model(ProtocolModel):
    def __init__(self) -> None:
        super().__init__(token_floor=lambda now: 0)


class ReadThenEnqueue(_Model):
    """The forwarder reads the owner, then appends in a second step (the classic lost wakeup):
    the client sends ``enqueue`` after ``get_lease_owner`` said the key was held."""

    def enqueue_raw(self, rec: KeyRecord, sid: str, record: str) -> LeaseResult:
        if sid not in rec.stored:
            rec.stored[sid] = Stored(record)
            rec.queue.append(sid)
        return LeaseResult(False, rec.owner, rec.token, position=len(rec.queue))


class ReleaseIgnoringQueue(_Model):
    """``transfer_to_next`` releases without looking at the queue."""

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
            return super().transfer_to_next(rec, owner, ttl_ms, claim, token, now, failure)
        self.complete(rec, owner, now, failure)
        self.free(rec, owner, now)
        return None


class HandoffKeepsToken(_Model):
    """A hand-off gives the next owner the finishing owner's token."""

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
        token = rec.token
        signal = super().grant_head(
            rec, ttl_ms, now, claimed=claimed, nonce=nonce, prev=prev, prev_token=prev_token
        )
        rec.token = token
        return replace(signal, token=token)


class GrantResendUnrecognised(_Model):
    """``acquire_or_enqueue`` forgets the nonce of the call that made the grant, so its resend
    reads its own grant as someone else's (a duplicate)."""

    def acquire_or_enqueue(
        self,
        rec: KeyRecord,
        sid: str,
        record: str,
        ttl_ms: int,
        nonce: str,
        now: int,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> LeaseResult | Full:
        result = super().acquire_or_enqueue(rec, sid, record, ttl_ms, nonce, now, max_queue)
        if rec.grant_nonce == nonce:
            rec.grant_nonce = None
        return result


class _RewritesFailures(_Model):
    """G6 applies a failure report as :meth:`rewrite` changes it (and the record with it)."""

    def rewrite(self, rec: KeyRecord, owner: str, failure: Failure) -> Failure:
        raise NotImplementedError

    def complete(
        self,
        rec: KeyRecord,
        owner: str,
        now: int,
        failure: Failure | None = None,
        *,
        mark_owner: bool = True,
    ) -> None:
        if failure is not None:
            failure = self.rewrite(rec, owner, failure)
        super().complete(rec, owner, now, failure, mark_owner=mark_owner)


class FailureDropsTaken(_RewritesFailures):
    """A failed run completes the signals it took instead of retrying them."""

    def rewrite(self, rec: KeyRecord, owner: str, failure: Failure) -> Failure:
        for sid in [s for s in rec.in_flight if s != owner]:
            rec.stored.pop(sid)
            rec.in_flight.remove(sid)
        return failure


class NoDedupeAfterCompletion(_Model):
    """Completed ids are not remembered: a late resend of a forward queues it again."""

    def remember_done(
        self, rec: KeyRecord, sid: str, token: int, now: int, ok: bool, attempts: int = 0
    ) -> None:
        super().remember_done(rec, sid, token, now, ok=False, attempts=attempts)


class AdoptDropsInFlight(_Model):
    """Adoption forgets what the dead owner had in flight."""

    def requeue_in_flight(self, rec: KeyRecord) -> None:
        for sid in rec.in_flight:
            rec.stored.pop(sid, None)
        rec.in_flight = []


class ClaimTwice(_Model):
    """A hand-off grant can be claimed by every copy of its envelope."""

    def claim(
        self, rec: KeyRecord, owner: str, token: int, ttl_ms: int, nonce: str, now: int
    ) -> Signal | None:
        rec.claimed = False
        return super().claim(rec, owner, token, ttl_ms, nonce, now)


class ResentReleaseLost(_Model):
    """A resent ``transfer_to_next`` is only recognised while p/pt still name the caller."""

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
        if not rec.holds(owner, token) and rec.prev != owner:
            return Lost(rec.owner)
        return super().transfer_to_next(rec, owner, ttl_ms, claim, token, now, failure)


class BoundIgnored(_Model):
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
    ) -> LeaseResult | Full:
        return super().acquire_or_enqueue(rec, sid, record, ttl_ms, nonce, now, 1 << 30)


class HaltIgnored(_Model):
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


class RedriveDrops(_Model):
    """A redrive clears the dead letters without queueing them (row V1 broken)."""

    def redrive(
        self, rec: KeyRecord, ids: tuple[str, ...] | None, now: int, nonce: str | None = None
    ) -> int:
        moved = len(rec.dead)
        rec.dead = []
        rec.halted = False
        return moved


class PartialUnrunCompleted(_RewritesFailures):
    """A partial report (G8) completes the ids it does not name, instead of requeueing them:
    the signals of a batch that never ran are lost."""

    def rewrite(self, rec: KeyRecord, owner: str, failure: Failure) -> Failure:
        if failure.completed is None:
            return failure
        ran = tuple(sid for sid in rec.in_flight if sid not in failure.failed)
        return replace(failure, completed=ran)


class PartialCompletedRequeued(_RewritesFailures):
    """A partial report (G8) sends the ids it names as completed back to the queue: signals
    that succeeded run again."""

    def rewrite(self, rec: KeyRecord, owner: str, failure: Failure) -> Failure:
        return failure if failure.completed is None else replace(failure, completed=())


@dataclass(frozen=True)
class Mutant:
    name: str
    model_class: type[ProtocolModel]
    rules: ClientRules = field(default_factory=ClientRules)
    family: str = "core"  # the bounds that can see its rule: "core" (small...) or "queue"

    def model(self) -> ProtocolModel:
        return self.model_class() if self.model_class is not ProtocolModel else _Model()


MUTANTS: tuple[Mutant, ...] = (
    Mutant("read-then-enqueue", ReadThenEnqueue, ClientRules(atomic_forward=False)),
    Mutant("release-ignoring-queue", ReleaseIgnoringQueue),
    Mutant("handoff-keeps-token", HandoffKeepsToken),
    Mutant("grant-resend-unrecognised", GrantResendUnrecognised),
    Mutant("failure-drops-taken", FailureDropsTaken),
    Mutant("no-dedupe-after-completion", NoDedupeAfterCompletion),
    Mutant("adopt-drops-in-flight", AdoptDropsInFlight),
    Mutant("claim-twice", ClaimTwice),
    Mutant("resent-release-lost", ResentReleaseLost),
    Mutant("ttl-clock-from-reply", ProtocolModel, ClientRules(valid_from_send=False)),
    Mutant("failed-take-completes", ProtocolModel, ClientRules(failed_take_fails_run=False)),
    Mutant("partial-unrun-completed", PartialUnrunCompleted),
    Mutant("partial-completed-requeued", PartialCompletedRequeued),
    Mutant("bound-ignored", BoundIgnored, family="queue"),
    Mutant("halt-ignored", HaltIgnored, family="queue"),
    Mutant("redrive-drops", RedriveDrops, family="queue"),
    Mutant("full-forward-dropped", ProtocolModel, ClientRules(full_fails_visibly=False), "queue"),
)
