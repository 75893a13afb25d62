"""The batch drain: an owner whose run succeeded runs what waits behind it under its own grant.

Handing the lease to the next signal costs a ``transfer_to_next`` per signal: a new grant, a
new token, a new handle each time. Instead, after a run that succeeded, the owner runs up to
``drain_batch`` queued signals one by one under its grant and hands off once at the end. Each
signal comes from a ``take_signals`` of one that also reports what succeeded since the last
report (row K1's ``completed``), so the backend always knows which signal runs: an owner that
dies mid-batch leaves behind only the signal it was running, charged one attempt (G5), and
nothing that succeeded runs again. A failed run ends the batch: the ``transfer_to_next`` that
follows reports it as a partial report (row G8), so it is retried first (or dead-lettered) and
whatever a failed ``take_signals`` moved in flight unseen goes back with its attempts.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leaseguard.errors import LeaseLostError
from leaseguard.events import rebuild_like
from leaseguard.renewal import LeaseHandle
from leaseguard.renewer import LeaseRenewer
from leaseguard.types import Signal, now_ms

from .failures import UnfinishedRuns, describe
from .responses import Outcome, Run

if TYPE_CHECKING:
    from .flow import Invocation


@dataclass
class Drained:
    """What a drain ran, for the report of the ``transfer_to_next`` that follows it."""

    # Succeeded and not yet reported by a take, after the grant's owner (which the report
    # always names: its done entry is marked succeeded only when the report lists it).
    completed: list[str]
    failed: list[Signal] = field(default_factory=list)  # the failed run's signal and its takes
    error: BaseException | None = None
    dead: list[Signal] = field(default_factory=list)  # the failed ones the report dead-letters
    cut: bool = False  # a take failed: it may have moved signals in flight unseen
    remote: bool = False  # stopped for the Lambda deadline: hand the rest off
    longest_ms: float = 0.0
    primary: Outcome | None = None  # the outcome of the invocation's primary signal, if run

    def report(self) -> dict[str, Any]:
        """The partial-report arguments of ``transfer_to_next`` ({} for a plain success)."""
        if not self.cut and self.error is None:
            return {}
        return {"completed": self.completed, "failed": [s.id for s in self.failed]}


def drain(
    invocation: Invocation,
    key: str,
    owner: Signal,
    handle: LeaseHandle,
    renewer: LeaseRenewer,
    *,
    primary: str,
    longest_ms: float,
    answered: bool = False,
) -> Generator[Run, Outcome, Drained]:
    """Run up to ``drain_batch`` queued signals behind ``owner``, whose run (under ``handle``)
    succeeded, taking each with the report of the one before. ``answered``: ``primary`` ran
    before the drain (the hand-off policy's question, as in the flow)."""
    options, telemetry = invocation.options, invocation.telemetry
    provider = invocation.guard.provider
    unreported = [s.id for s in handle.taken]
    drained = Drained([owner.id, *unreported], longest_ms=longest_ms)
    renewer.follow(handle)  # the same grant: its next renewal stays due when it was
    try:
        for ran in range(options.drain_batch):
            answered = answered or drained.primary is not None
            if ran and invocation.place_next(drained.longest_ms, answered) == "remote":
                drained.remote = True
                return drained
            # A kwargs dict: completed= is not part of the QueueProvider protocol, only of the
            # providers with partial_reports (the flow drains only with those).
            progress: dict[str, Any] = {"token": handle.token, "completed": drained.completed}
            try:
                batch = provider.take_signals(key, owner.id, 1, **progress)
            except LeaseLostError:
                handle._mark_lost("take_signals found the lease owned by someone else")
                return drained
            except Exception as exc:
                # It may have moved a signal in flight unseen: it goes back unrun with the
                # report (G8), which names again what this take may not have reported.
                telemetry.log(
                    logging.ERROR,
                    "take_signals failed; what it took goes back",
                    error=describe(exc),
                )
                drained.cut = True
                return drained
            drained.completed = [owner.id]  # the take reported the rest: they are done
            if not batch:
                return drained
            signal = batch[0]
            telemetry.queued_age(signal)  # taken oldest first: the queue's oldest
            if handle._settle():
                return drained  # the take's reply came after the lease ran out: run nothing
            outcome, error, took = yield from _run_item(invocation, handle, signal, drained)
            if primary in (signal.id, *(s.id for s in took)):
                drained.primary = Outcome(error=error) if error else outcome
            if error is not None:
                reported = not handle._settle()
                drained.failed = [signal, *took]
                drained.error = error
                drained.dead = [
                    s
                    for s in drained.failed
                    if invocation.guard.failures.signal_failed(key, s, error, reported=reported)
                ]
                return drained
            drained.completed += [signal.id, *(s.id for s in took)]
            if handle._settle() or drained.cut:
                return drained  # lost (the caller hands nothing off), or cut by a failed take
    finally:
        renewer.pause()
    return drained


def _run_item(
    invocation: Invocation, handle: LeaseHandle, signal: Signal, drained: Drained
) -> Generator[Run, Outcome, tuple[Outcome, BaseException | None, list[Signal]]]:
    """Run one taken signal under the batch's grant: its outcome, its error (the handler's, or
    a failed take of its own) and the signals its handler took."""
    options, telemetry = invocation.options, invocation.telemetry
    telemetry.timing("LeaseWaitMs", now_ms() - signal.enqueued_at_ms)
    mark = len(handle.taken)
    if signal.attempts >= options.max_attempts:
        error: BaseException | None = UnfinishedRuns(
            f"{signal.attempts} earlier runs did not finish (crash, timeout or lost lease)"
        )
        return Outcome(error=error), error, []
    started = invocation.clock()
    # current_lease() names the item (its id as owner), under the owner's grant
    outcome = yield Run(rebuild_like(invocation.event, signal.payload), ItemLease(handle, signal))
    held_ms = (invocation.clock() - started) * 1000
    drained.longest_ms = max(drained.longest_ms, held_ms)
    telemetry.timing("LeaseHoldMs", held_ms)
    if handle.take_failed:
        # What that take moved in flight unseen is older than anything still queued: the
        # batch stops here and the partial report sends it back unrun (G8).
        drained.cut = True
    return outcome, outcome.error, handle.taken[mark:]


class ItemLease(LeaseHandle):
    """What ``current_lease()`` answers while one item of a batch drain runs: the item's own id
    as :attr:`owner` (so downstream writes deduplicated on ``current_lease().owner`` name the
    event that runs, as in every other mode), with the batch owner's grant behind it.

    The item runs under the batch owner's grant: :attr:`token` is that grant's token (the one a
    fenced write may use), renewals keep going under it, and :attr:`lost`, :meth:`check`,
    :meth:`take_signals` all act on it. :attr:`batch_owner` names the grant's owner.
    """

    def __init__(self, batch: LeaseHandle, item: Signal) -> None:
        # No super().__init__: every piece of state is the batch handle's, read through.
        self.batch = batch
        self.provider = batch.provider
        self.key = batch.key
        self.owner = item.id
        self.batch_owner = batch.owner
        self.ttl_ms = batch.ttl_ms
        self.clock = batch.clock
        self._on_lost = None
        self._lock = batch._lock

    @property
    def token(self) -> int | None:
        return self.batch.token

    @token.setter
    def token(self, value: int | None) -> None:
        self.batch.token = value

    @property
    def lost_reason(self) -> str | None:
        return self.batch.lost_reason

    @lost_reason.setter
    def lost_reason(self, value: str | None) -> None:
        self.batch.lost_reason = value

    @property
    def taken(self) -> list[Signal]:
        return self.batch.taken

    @taken.setter
    def taken(self, value: list[Signal]) -> None:
        self.batch.taken = value

    @property
    def take_failed(self) -> bool:
        return self.batch.take_failed

    @take_failed.setter
    def take_failed(self, value: bool) -> None:
        self.batch.take_failed = value

    @property
    def grant_owner(self) -> str:
        return self.batch.owner

    @property
    def lost(self) -> bool:
        return self.batch.lost

    @property
    def _valid_until(self) -> float:  # type: ignore[override]
        return self.batch._valid_until

    @property
    def remaining_ms(self) -> int:
        return self.batch.remaining_ms

    def _settle(self) -> bool:
        return self.batch._settle()

    def take_signals(self, limit: int = 10) -> list[Signal]:
        return self.batch.take_signals(limit)

    def _renewed(self, sent_at: float) -> None:
        self.batch._renewed(sent_at)

    def _mark_lost(self, reason: str) -> None:
        self.batch._mark_lost(reason)
