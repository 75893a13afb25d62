"""Seeded mutants: each breaks one rule of the protocol, and the explorer must catch every one.

A mutant that survives means the invariants (or the bounds) cannot see that rule, so
``make model-check`` fails when any mutant goes uncaught.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from leaseguard.types import LeaseResult, Signal

from .failed_work_mutants import (
    BoundIgnored,
    DeadPastBound,
    HaltIgnored,
    MutantModel,
    OverflowDropped,
    OverflowNotHalted,
    RedriveDrops,
    RedriveForgetsItsCall,
)
from .guarded import ExplorerProvider
from .model import ProtocolModel
from .source_mutants import GUARD_MUTANTS, SourceChange, source_mutation
from .state import DEFAULT_MAX_QUEUE, Done, Failure, Full, KeyRecord, Lost, Stored


class ReadThenEnqueue(MutantModel):
    """The forwarder reads the owner, then appends in a second step (the classic lost wakeup):
    the client sends ``enqueue`` after ``get_lease_owner`` said the key was held."""

    def enqueue_raw(self, rec: KeyRecord, sid: str, record: str) -> LeaseResult:
        if sid not in rec.stored:
            rec.stored[sid] = Stored(record)
            rec.queue.append(sid)
        return LeaseResult(False, rec.owner, rec.token, position=len(rec.queue))


class ReleaseIgnoringQueue(MutantModel):
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


class HandoffKeepsToken(MutantModel):
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


class GrantResendUnrecognised(MutantModel):
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
        room: int | None = None,
    ) -> LeaseResult | Full:
        result = super().acquire_or_enqueue(rec, sid, record, ttl_ms, nonce, now, max_queue, room)
        if rec.grant_nonce == nonce:
            rec.grant_nonce = None
        return result


class _RewritesFailures(MutantModel):
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


class NoDedupeAfterCompletion(MutantModel):
    """Completed ids are not remembered: a late resend of a forward queues it again."""

    def remember_done(
        self, rec: KeyRecord, sid: str, token: int, now: int, ok: bool, attempts: int = 0
    ) -> None:
        super().remember_done(rec, sid, token, now, ok=False, attempts=attempts)


class DoneForgetsNewest(MutantModel):
    """The done memory past its bound forgets its newest id instead of its oldest."""

    def remember_done(
        self, rec: KeyRecord, sid: str, token: int, now: int, ok: bool, attempts: int = 0
    ) -> None:
        rec.done.pop(sid, None)
        if len(rec.done) >= self.done_limit:
            del rec.done[list(rec.done)[-1]]
        rec.done[sid] = Done(token, now, ok, attempts)


class AdoptDropsInFlight(MutantModel):
    """Adoption forgets what the dead owner had in flight."""

    def requeue_in_flight(self, rec: KeyRecord) -> None:
        for sid in rec.in_flight:
            rec.stored.pop(sid, None)
        rec.in_flight = []


class ClaimTwice(MutantModel):
    """A hand-off grant can be claimed by every copy of its envelope."""

    def claim(
        self, rec: KeyRecord, owner: str, token: int, ttl_ms: int, nonce: str, now: int
    ) -> Signal | None:
        rec.claimed = False
        return super().claim(rec, owner, token, ttl_ms, nonce, now)


class ResentReleaseLost(MutantModel):
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


class PartialUnrunCompleted(_RewritesFailures):
    """A partial report (G8) completes the ids it does not name, instead of requeueing them:
    the signals of a batch that never ran are lost."""

    def rewrite(self, rec: KeyRecord, owner: str, failure: Failure) -> Failure:
        if failure.completed is None:
            return failure
        ran = tuple(sid for sid in rec.in_flight if sid not in failure.failed)
        return replace(failure, completed=ran)


class PartialCompletedRequeued(_RewritesFailures):
    """A report of completed ids (a partial report, G8, or a take's, K1) sends them back to
    the queue: signals that succeeded run again."""

    def rewrite(self, rec: KeyRecord, owner: str, failure: Failure) -> Failure:
        return failure if failure.completed is None else replace(failure, completed=())

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
        if rec.holds(owner, token) and rec.take_nonce != nonce:
            back = [sid for sid in rec.in_flight if sid in completed and sid != owner]
            rec.in_flight = [sid for sid in rec.in_flight if sid not in back]
            rec.queue[0:0] = back
        return super().take(rec, owner, limit, token, nonce, now, completed)


class FailoverWithoutWait(MutantModel):
    """Redis replicas without ``replicas=N``: a failover may lose a write whose reply was
    delivered (an accepted forward, a grant its owner runs under; issue 23 finding 5)."""

    failover_keeps_acknowledged = False


class ChargesUnclaimed(MutantModel):
    """The old G5: every in-flight signal of a dead owner is charged an attempt, also the
    signal of a grant that was never claimed (its envelope was late), which never ran."""

    def requeue_in_flight(self, rec: KeyRecord) -> None:
        for sid in rec.in_flight:
            rec.stored[sid].attempts += 1
        rec.queue[0:0] = rec.in_flight
        rec.in_flight = []


class ReadThenEnqueueProvider(ExplorerProvider):
    """The forward as two steps: read the owner, then enqueue (or acquire) in a second step
    (the classic lost wakeup)."""

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        model = self.model
        holder = self._step(
            key, "get_lease_owner", (), lambda rec, now, nonce: model.get_owner(rec, now)
        )
        if holder is None:
            return super()._acquire_or_enqueue(key, signal, record, ttl_ms, max_queue)
        assert isinstance(model, ReadThenEnqueue)
        return self._step(
            key,
            "enqueue",
            (signal.id,),
            lambda rec, now, nonce: model.enqueue_raw(rec, signal.id, record),
        )


@dataclass(frozen=True)
class Mutant:
    """One broken rule: in the model (``model_class``), in the provider's steps
    (``provider_class``), or in the guard's own code (``source``)."""

    name: str
    model_class: type[ProtocolModel] = ProtocolModel
    family: str = "core"  # the bounds that can see its rule: "core" (small...) or "queue"
    provider_class: type[ExplorerProvider] = ExplorerProvider
    source: SourceChange | None = None

    def model(self) -> ProtocolModel:
        return self.model_class() if self.model_class is not ProtocolModel else MutantModel()

    @contextmanager
    def applied(self) -> Iterator[None]:
        """While inside, the guard's code is this mutant's (if it changes the guard)."""
        if self.source is None:
            yield
            return
        with source_mutation(
            importlib.import_module(self.source.module), self.source.old, self.source.new
        ):
            yield


MUTANTS: tuple[Mutant, ...] = (
    Mutant("read-then-enqueue", ReadThenEnqueue, provider_class=ReadThenEnqueueProvider),
    Mutant("release-ignoring-queue", ReleaseIgnoringQueue),
    Mutant("handoff-keeps-token", HandoffKeepsToken),
    Mutant("grant-resend-unrecognised", GrantResendUnrecognised),
    Mutant("failure-drops-taken", FailureDropsTaken),
    Mutant("no-dedupe-after-completion", NoDedupeAfterCompletion),
    Mutant("adopt-drops-in-flight", AdoptDropsInFlight),
    Mutant("claim-twice", ClaimTwice),
    Mutant("resent-release-lost", ResentReleaseLost),
    Mutant("partial-unrun-completed", PartialUnrunCompleted, family="drain"),
    Mutant("partial-completed-requeued", PartialCompletedRequeued, family="drain"),
    Mutant("charges-unclaimed", ChargesUnclaimed),
    Mutant("failover-without-wait", FailoverWithoutWait, family="failover"),
    Mutant("done-forgets-newest", DoneForgetsNewest, family="memory"),
    Mutant("bound-ignored", BoundIgnored, family="queue"),
    Mutant("halt-ignored", HaltIgnored, family="queue"),
    Mutant("redrive-drops", RedriveDrops, family="queue"),
    Mutant("redrive-resend-unrecognised", RedriveForgetsItsCall, family="queue"),
    Mutant("dead-past-bound", DeadPastBound, family="dead"),
    Mutant("dead-overflow-dropped", OverflowDropped, family="dead"),
    Mutant("dead-overflow-not-halted", OverflowNotHalted, family="dead"),
    *(Mutant(name, family=family, source=change) for name, family, change in GUARD_MUTANTS),
)
