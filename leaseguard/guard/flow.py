"""One invocation of a guarded handler, as a generator that yields each handler run.

The flow makes every backend call and decision; a driver (:mod:`.drivers`) runs the handler
whenever the flow yields a :class:`Run` and sends back its :class:`Outcome`. The sync and the
async wrappers are two drivers of this one flow, so ``async def`` handlers get exactly the same
semantics.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import replace
from functools import partial
from typing import Any

from leaseguard.errors import LeaseBackendError, LeaseLostError, PayloadTooLarge, QueueFull
from leaseguard.events import as_json, rebuild_like
from leaseguard.handoff import Envelope, InvalidEnvelope, parse_envelope
from leaseguard.renewal import LeaseHandle
from leaseguard.renewer import LeaseRenewer
from leaseguard.types import Signal, now_ms

from . import responses, retries
from .call import Call
from .drain import Drained, drain
from .failures import UnfinishedRuns, describe
from .handler import GuardedHandler
from .lost import lost_before_handoff, lost_callback
from .responses import Outcome, Run, Status
from .tracebacks import HandlerErrors

Flow = Generator[Run, Outcome, Any]


class Invocation:
    """One call of a guarded handler."""

    def __init__(self, guard: GuardedHandler, call: Call) -> None:
        self.guard = guard
        self.options = guard.options
        self.call = call
        self.event = call.event
        self.context = call.context
        self.telemetry = guard.telemetry
        self.clock = guard.clock
        # An API Gateway (or function URL, ALB) caller waits for this invocation's answer: once
        # its own event ran, nothing else runs before it is given (the policy hands off).
        self.waits = guard.policy.waits(self.event)
        # What the hand-off's report did with the primary signal if its run failed: retried from
        # the queue unless the report dead-lettered it (or kept it on the halted key).
        self.fate = Status.RETRIED
        # What the handler raised (the driver notes each): re-raised to the caller without the
        # guard's frames in front of the handler's (tracebacks.py).
        self.handler_errors = HandlerErrors()

    def flow(self) -> Flow:
        if self.context is None:
            self.guard.warn_without_context()
        provider = self.guard.provider
        try:
            envelope = parse_envelope(self.event)
        except InvalidEnvelope as exc:
            self.telemetry.log(
                logging.WARNING, "rejected malformed handoff envelope", error=str(exc)
            )
            self.telemetry.count("HandoffRejected")
            return responses.rejected(str(exc))
        if envelope is not None:
            return (yield from self._receive(envelope))

        key = self.guard.key_of(self.event)
        own = Signal(self.options.signal_id_fn(self.event, self.context), as_json(self.event))
        sent_at = self.clock()
        try:
            # Without a bound of its own the call names none: a provider of another package
            # need only implement SignalQueue's acquire_or_enqueue.
            if self.options.max_queue is None:
                result = provider.acquire_or_enqueue(key, own, self.options.ttl_ms)
            else:
                result = provider.acquire_or_enqueue(
                    key, own, self.options.ttl_ms, max_queue=self.options.max_queue
                )
        except QueueFull as full:
            self.telemetry.count("QueueFull")
            self.telemetry.log(
                logging.WARNING,
                "refused an event: the key's queue is full",
                lease_key=full.key,
                lease_holder=full.holder,
                queue_depth=full.depth,
                max_queue=full.limit,
                **({"reason": full.why} if full.why else {}),
            )
            return responses.queue_full(self.event, full)
        except PayloadTooLarge as large:
            self.telemetry.log(logging.WARNING, "refused an event: too large", error=str(large))
            return responses.too_large(self.event, large)
        if not result.acquired and result.position is None:
            # Already in flight (its owner runs it, or this is a second delivery of the event
            # that owns the key), done, or dead-lettered: running it here would run it again.
            self.telemetry.count("DuplicateDelivery")
            status = self.guard.failures.not_requeued(provider, key, own.id, result.owner)
            return responses.forwarded(self.event, key, own.id, result.owner, None, status=status)
        if not result.acquired:
            self.telemetry.count("LeaseForwarded")
            # DEBUG: a busy key forwards most of its events, and one INFO line each cost the
            # forwarder a third of its time (Powertools' JSON formatting) and CloudWatch its
            # volume; the LeaseForwarded metric and the response body report every forward.
            self.telemetry.log(
                logging.DEBUG,
                "forwarded event to the key's owner",
                lease_key=key,
                lease_holder=result.owner,
                queue_position=result.position,
                signal_id=own.id,
            )
            if result.position is not None:
                self.telemetry.count("QueueDepth", result.position)
            return responses.forwarded(self.event, key, own.id, result.owner, result.position)
        self.telemetry.count("LeaseAcquired")
        if result.adopted is not None:
            # The key's owner had died with work queued: how long its oldest event has waited
            # is what shows a stuck key (docs/deploy.md, the queued-age alarm).
            self.telemetry.queued_age(result.adopted)
        first = result.adopted or replace(own, token=result.token, attempts=result.attempts)
        own_event = result.adopted is None
        outcome = yield from self._chain(key, first, sent_at, primary=own.id, own_event=own_event)
        return responses.chain_result(
            self.event, key, own.id, outcome, own_event=own_event, fate=self.fate
        )

    def _receive(self, envelope: Envelope) -> Flow:
        # An envelope comes by async Invoke or SQS, whatever the setting says: nobody waits.
        self.waits = False
        sent_at = self.clock()
        signal = self.guard.provider.claim_signal(
            envelope.key, envelope.owner, envelope.token, self.options.ttl_ms
        )
        if signal is None:
            self.telemetry.count("HandoffRejected")
            self.telemetry.log(
                logging.WARNING,
                "ignored a stale, duplicate or forged handoff envelope",
                lease_key=envelope.key,
                lease_owner=envelope.owner,
                fencing_token=envelope.token,
            )
            return responses.rejected("grant not claimable", envelope.key)
        self.telemetry.count("LeaseAcquired")
        key = envelope.key
        outcome = yield from self._chain(key, signal, sent_at, primary=signal.id, own_event=False)
        return responses.chain_result(
            self.event, key, signal.id, outcome, own_event=False, fate=self.fate
        )

    def _chain(
        self, key: str, first: Signal, sent_at: float, *, primary: str, own_event: bool
    ) -> Generator[Run, Outcome, Outcome | None]:
        """Run ``first``, then each signal the lease is handed to while it can run inline; the
        outcome of ``primary``'s run (``None`` if the chain stopped before it). ``sent_at`` is
        when the request that granted ``first`` was sent."""
        # One renewer for the whole chain, stopped before the invocation returns (Lambda freezes
        # the environment then, and a frozen renewer would look alive).
        renewer = self.guard.renewer_class(None, self.options.renew_every_ms)
        try:
            return (yield from self._runs(key, first, sent_at, primary, own_event, renewer))
        finally:
            renewer.stop()

    def _runs(
        self,
        key: str,
        first: Signal,
        sent_at: float,
        primary: str,
        own_event: bool,
        renewer: LeaseRenewer,
    ) -> Generator[Run, Outcome, Outcome | None]:
        options, provider, telemetry = self.options, self.guard.provider, self.telemetry
        primary_outcome: Outcome | None = None
        longest_ms = 0.0
        current: Signal | None = first
        handed = False  # current was handed this key by the owner before it (a queue formed)
        while current is not None:
            handle = LeaseHandle(
                provider,
                key,
                current.id,
                current.token,
                options.ttl_ms,
                on_lost=partial(lost_callback, self.telemetry, self.options.on_lost),
                sent_at=sent_at,
                clock=self.clock,
            )
            is_primary = current.id == primary
            if is_primary and own_event:
                event = self.event
            else:
                event = rebuild_like(self.event, current.payload)
                telemetry.timing("LeaseWaitMs", now_ms() - current.enqueued_at_ms)
            # The platform retries the invocation's own event (it re-raises); every other
            # signal this run held is retried from the queue, or dead-lettered.
            platform_retries = is_primary and own_event
            if handle._settle():
                # The grant's reply came after its TTL ran out: another invocation may own the
                # key by now, so the handler must not run. The signal stays in flight and goes
                # back to the queue with the expired lease (G5).
                telemetry.count("LeaseLost")
                telemetry.log(
                    logging.ERROR,
                    "the grant arrived after its lease ran out; not running it",
                    lease_key=key,
                    lease_owner=handle.owner,
                )
                break
            if not platform_retries and current.attempts >= options.max_attempts:
                # Its earlier runs all died before they could report (G5 counted each): one
                # more would most likely die the same way, so it is dead-lettered unrun.
                outcome = Outcome(
                    error=UnfinishedRuns(
                        f"{current.attempts} earlier runs did not finish "
                        "(crash, timeout or lost lease)"
                    )
                )
            else:
                renewer.follow(handle)
                started = self.clock()
                try:
                    outcome = yield Run(event, handle)
                finally:
                    handle._settle()  # a TTL that ran out is the reason, not the pause below
                    renewer.pause()
                held_ms = (self.clock() - started) * 1000
                longest_ms = max(longest_ms, held_ms)
                telemetry.timing("LeaseHoldMs", held_ms)
            if is_primary:
                primary_outcome = outcome
            error = outcome.error
            # A take that failed may have moved signals in flight that the handler never saw.
            # A partial report (G8) sends them back unrun and lets the run's own result stand;
            # without partial reports the run ends as failed, so they are retried, not completed.
            unseen = handle.take_failed
            if error is None and unseen and not self._partial_reports():
                error = LeaseBackendError("take_signals failed during the run")
            dead: list[Signal] = []
            failed: list[Signal] = []  # reported failed: dead-lettered, or back at the head
            if error is not None:
                # The own event is the platform's to retry, unless this failure is its last
                # (its earlier failed deliveries count too): then it is dead-lettered here.
                last = current.attempts + 1 >= options.max_attempts
                owned = [] if platform_retries and not last else [current]
                reported = not handle._settle()
                failed = owned + handle.taken
                for signal in failed:
                    if self.guard.failures.signal_failed(key, signal, error, reported=reported):
                        dead.append(signal)
                if platform_retries and outcome.error is None:
                    primary_outcome = Outcome(error=error)
            answered = primary_outcome is not None
            remote = not handle._settle() and self.place_next(longest_ms, answered) == "remote"
            drained: Drained | None = None
            drains = handed and not remote and not handle.lost and not unseen and self._drains()
            if error is None and drains:
                drained = yield from drain(
                    self,
                    key,
                    current,
                    handle,
                    renewer,
                    primary=primary,
                    longest_ms=longest_ms,
                    answered=answered,
                )
                longest_ms, remote = drained.longest_ms, drained.remote
                if drained.primary is not None:
                    primary_outcome = drained.primary
                error, dead, failed = drained.error, drained.dead, drained.failed
            if handle._settle():
                telemetry.count("LeaseLost")
                telemetry.log(
                    logging.ERROR,
                    "lease lost while the handler ran; not handing off",
                    lease_key=key,
                    lease_owner=handle.owner,
                    reason=handle.lost_reason,
                )
                break
            report: dict[str, Any] = drained.report() if drained is not None else {}
            if drained is None and unseen and self._partial_reports():
                ran = [current.id, *(s.id for s in handle.taken)]
                report = {"completed": [], "failed": ran} if error else {"completed": ran}
            if error is not None:
                report |= {
                    "error": describe(error),
                    "requeue_owner": not platform_retries,
                    "max_attempts": options.max_attempts,
                }
                if options.retries.on_poison != "skip":
                    report["on_poison"] = options.retries.on_poison
            # A failed signal that goes back to the head is granted the key again by this
            # hand-off: with a retry delay, unclaimed, for as long as it waits (.retries).
            retry = retries.plan(self, key, error, failed, dead)
            ttl, claim = options.ttl_ms, not remote
            if retry is not None:
                ttl, claim = retry.ttl_ms, False
            sent_at = self.clock()
            try:
                nxt = provider.transfer_to_next(
                    key, current.id, ttl, claim=claim, token=handle.token, **report
                )
            except LeaseLostError as lost:
                lost_before_handoff(self.telemetry, handle, lost, provider)
                break
            if dead and error is not None:
                lettered = self.guard.failures.reported_dead(provider, key, dead, error)
                if any(signal.id == primary for signal in dead):
                    self.fate = Status.DEAD_LETTERED if primary in lettered else Status.HALTED
            if nxt is None:
                break
            telemetry.count("LeaseHandedOff")
            telemetry.queued_age(nxt)  # the queue's oldest: it waited this long for the key
            envelope = Envelope(key, nxt.id, nxt.token or 0, nxt.payload)
            if retry is not None and nxt.id == retry.signal_id:
                retries.announce(self.telemetry, envelope, retry)
                if retry.later is not None:
                    self._dispatch(envelope, retry)
                break
            if remote:
                self._dispatch(envelope)
                break
            if retry is not None:
                # The head was not the failed signal (another went back before it), so it
                # runs now; its grant was made unclaimed for the wait: claim it to run inline.
                sent_at = self.clock()
                claimed = provider.claim_signal(key, nxt.id, nxt.token or 0, options.ttl_ms)
                if claimed is None:
                    break  # it ran out meanwhile: the key's next event or the sweeper runs it
                nxt = claimed
            current, handed = nxt, True
        return primary_outcome

    def _drains(self) -> bool:
        """Whether owners run batches behind their runs (docs/protocol.md, row G8): a provider
        that takes partial reports, and ``drain_batch`` set. Only a run that was handed the key
        inline takes a batch: a queue formed behind its owner, so the take will likely find
        some, whereas after an uncontended grant it would mostly be a wasted round trip."""
        return self.options.drain_batch > 0 and self._partial_reports()

    def _partial_reports(self) -> bool:
        return bool(getattr(self.guard.provider, "partial_reports", False))

    def place_next(self, longest_ms: float, answered: bool) -> str:
        """Where the next signal runs (:meth:`HandoffPolicy.place_next`); ``answered``: the
        invocation's own event (or the signal it was sent to run) has run."""
        waiting = self.waits and answered
        placement = self.guard.policy.place_next(self.context, longest_ms, answered=waiting)
        if placement == "inline, cannot dispatch":
            if waiting and self.options.handoff.mode == "auto":
                why = (
                    "the caller waits for this invocation's answer, but the next signal cannot "
                    "be handed off without a Lambda context naming the function (or queue_url);"
                    " running it inline before answering"
                )
            else:
                why = (
                    f'handoff="{self.options.handoff.mode}" is not possible '
                    "without a Lambda context; running the next signal inline"
                )
            self.telemetry.log(logging.WARNING, why)
        return placement

    def _dispatch(self, envelope: Envelope, retry: retries.Retry | None = None) -> None:
        """Send ``envelope`` now, or, for a retry that waits by SQS, to arrive after its
        delay."""
        try:
            if retry is not None and retry.later is not None:
                retry.later.dispatch_later(envelope, retry.delay_ms)
            else:
                self.guard.policy.dispatcher(self.context).dispatch(envelope)
        except Exception as exc:
            # The grant stays in the backend unclaimed; once its TTL passes, adopt_orphans (the
            # sweeper) or the key's next event delivers it. Failing this invocation instead
            # would make Lambda retry an event that already ran.
            self.telemetry.count("HandoffFailed")
            self.telemetry.log(
                logging.ERROR,
                "handoff dispatch failed; the signal will be re-delivered after its lease expires",
                lease_key=envelope.key,
                lease_owner=envelope.owner,
                error=str(exc),
            )
            return
        self.telemetry.count("HandoffDispatched")
