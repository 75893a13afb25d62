"""The batch drain: an owner whose run succeeded runs what waits behind it under its own grant.

Handing the lease to the next signal costs a ``transfer_to_next`` per signal, one round trip
each, which caps a busy key at one event per round trip. Instead, after a run that succeeded,
the owner takes up to ``drain_batch`` queued signals in one ``take_signals`` and runs them one
by one under its grant, then reports them all in the ``transfer_to_next`` that follows. When
every run succeeded that report is a plain success. When one fails, the ones before it are done
and the ones after it never ran: the report is partial (docs/protocol.md, row G8), so the
failed one is retried first (or dead-lettered), the rest keep their place and their counts, and
nothing that succeeded runs again.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leaseguard.errors import LeaseBackendError, LeaseLostError
from leaseguard.events import rebuild_like
from leaseguard.renewal import LeaseHandle, LeaseRenewer
from leaseguard.types import Signal, now_ms

from .failures import UnfinishedRuns, describe
from .responses import Outcome, Run

if TYPE_CHECKING:
    from .flow import Invocation


@dataclass
class Drained:
    """What a drain ran, for the report of the ``transfer_to_next`` that follows it."""

    completed: list[str]  # ran and succeeded: the owner, what it took, then the batch's
    failed: list[Signal] = field(default_factory=list)  # the failed run's signal and its takes
    error: BaseException | None = None
    dead: list[Signal] = field(default_factory=list)  # the failed ones the report dead-letters
    cut: bool = False  # a taken signal may not have run: the report must be partial
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
) -> Generator[Run, Outcome, Drained]:
    """Take and run one batch behind ``owner``, whose run (under ``handle``) succeeded."""
    options, telemetry = invocation.options, invocation.telemetry
    drained = Drained([owner.id, *(s.id for s in handle.taken)], longest_ms=longest_ms)
    try:
        batch = invocation.guard.provider.take_signals(
            key, owner.id, options.drain_batch, token=handle.token
        )
    except LeaseLostError:
        handle.mark_lost("take_signals found the lease owned by someone else")
        return drained
    except Exception as exc:
        # It may have moved signals in flight without this owner seeing them: they go back
        # unrun with the report (G8).
        telemetry.log(
            logging.ERROR, "take_signals failed; what it took goes back", error=describe(exc)
        )
        drained.cut = True
        return drained
    if not batch:
        return drained  # a plain success: nothing was queued
    renewer.follow(handle)  # the same grant: its next renewal stays due when it was
    # A run's handler that calls take_signals gets the batch's next signals first (FIFO);
    # whatever is left here when the drain stops never ran.
    handle.ahead = list(batch)
    policy, first = invocation.guard.policy, True
    try:
        while handle.ahead:
            if not first and policy.place_next(invocation.context, drained.longest_ms) == "remote":
                drained.remote = True  # the rest is handed off: `ahead` keeps it (cut below)
                return drained
            first = False
            signal = handle.ahead.pop(0)
            telemetry.timing("LeaseWaitMs", now_ms() - signal.enqueued_at_ms)
            mark = len(handle.taken)
            if signal.attempts >= options.max_attempts:
                error: BaseException | None = UnfinishedRuns(
                    f"{signal.attempts} earlier runs did not finish (crash, timeout or lost lease)"
                )
                outcome = Outcome(error=error)
            else:
                started = invocation.clock()
                # current_lease() names the item (its id as owner), under the owner's grant
                item = ItemLease(handle, signal)
                outcome = yield Run(rebuild_like(invocation.event, signal.payload), item)
                held_ms = (invocation.clock() - started) * 1000
                drained.longest_ms = max(drained.longest_ms, held_ms)
                telemetry.timing("LeaseHoldMs", held_ms)
                error = outcome.error
                if error is None and handle.take_failed:
                    error = LeaseBackendError("take_signals failed during the run")
            took = handle.taken[mark:]
            if primary in (signal.id, *(s.id for s in took)):
                drained.primary = Outcome(error=error) if error else outcome
            if error is not None:
                reported = not handle.settle()
                drained.failed = [signal, *took]
                drained.error = error
                drained.dead = [
                    s
                    for s in drained.failed
                    if invocation.guard.failures.signal_failed(key, s, error, reported=reported)
                ]
                return drained
            drained.completed += [signal.id, *(s.id for s in took)]
            if handle.settle():
                return drained  # lost: the caller hands nothing off
    finally:
        drained.cut = drained.cut or bool(handle.ahead)
        handle.ahead = []
        renewer.pause()
    return drained


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
    def ahead(self) -> list[Signal]:
        return self.batch.ahead

    @ahead.setter
    def ahead(self, value: list[Signal]) -> None:
        self.batch.ahead = value

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
    def valid_until(self) -> float:
        return self.batch.valid_until

    @property
    def remaining_ms(self) -> int:
        return self.batch.remaining_ms

    def settle(self) -> bool:
        return self.batch.settle()

    def take_signals(self, limit: int = 10) -> list[Signal]:
        return self.batch.take_signals(limit)

    def renewed(self, sent_at: float) -> None:
        self.batch.renewed(sent_at)

    def mark_lost(self, reason: str) -> None:
        self.batch.mark_lost(reason)
