"""``@lease_owned``: one invocation at a time owns a key; the others forward their events to it.

For each invocation::

    key = key_fn(event)
    acquire_or_enqueue(key, Signal(request id, event))
      ├─ queued  → return "forwarded" (HTTP 202 for API Gateway); the handler does not run
      └─ owner   → renew every ttl/3 on a thread ─ run handler ─ stop + join the thread
                   └─ transfer_to_next: the next queued signal becomes owner, no gap
                        ├─ time left  → run it inline, same invocation (and repeat)
                        ├─ no time    → async Invoke of this function, or SQS, with an envelope
                        └─ queue empty → the key is released

The flow lives in one generator (:meth:`_Invocation.flow`) that *yields* each handler run to a
driver; the sync and the async wrappers are two drivers of the same flow, so ``async def``
handlers get exactly the same semantics.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar, cast

from leaseguard.batch import current_lambda_context
from leaseguard.config import DEFAULT_TTL_MS, provider_from_env
from leaseguard.contract import LeaseProvider, is_lease_provider
from leaseguard.errors import (
    ConfigurationError,
    HandlerKeyError,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseLostError,
    PayloadTooLarge,
    QueueFull,
)
from leaseguard.events import (
    as_json,
    forwarded_response,
    is_api_gateway,
    rebuild_like,
    signal_id,
)
from leaseguard.handoff import (
    Dispatcher,
    Envelope,
    InvalidEnvelope,
    InvokeDispatcher,
    SqsDispatcher,
    parse_envelope,
)
from leaseguard.observability import Telemetry
from leaseguard.protocol.model import DEFAULT_MAX_ATTEMPTS
from leaseguard.providers.base import MAX_QUEUE_LIMIT, ON_POISON, OnPoison
from leaseguard.renewal import LeaseHandle, LeaseRenewer, lease_scope
from leaseguard.signals import Signal, SignalQueue, is_signal_queue, now_ms
from leaseguard.stacking import ROUTE_ADVICE, check_handler_stack, check_not_inside_idempotency
from leaseguard.validation import check_key, check_positive_int, check_ttl

F = TypeVar("F", bound=Callable[..., Any])
_CallArgs = tuple[tuple[Any, ...], dict[str, Any]]
Handoff = Literal["auto", "inline", "invoke", "sqs"]
HANDOFF_MODES = ("auto", "inline", "invoke", "sqs")
DEFAULT_HANDOFF_MARGIN_MS = 3_000


class QueueProvider(LeaseProvider, SignalQueue, Protocol):
    """A lease provider that also implements the signal queue (every built-in one does). Its
    owner-side calls take the grant's fencing token, renewals too."""

    def renew_lease(
        self, key: str, owner: str, ttl_ms: int, *, token: int | None = None
    ) -> bool: ...


@dataclass(frozen=True)
class _Run:
    """The flow asks its driver to run the handler on ``event`` while ``handle`` is held."""

    event: Any
    handle: LeaseHandle


@dataclass(frozen=True)
class _Outcome:
    value: Any = None
    error: BaseException | None = None


class UnfinishedRuns(Exception):
    """The error a signal is dead-lettered with when it reached ``max_attempts`` through runs
    that never finished (its owners' leases ran out: a crash, a timeout, a lost lease)."""


@dataclass(frozen=True)
class _Call:
    """How the wrapper was called, so the handler can be called the same way with another
    event: ``handler(event, context)`` from Lambda, ``record_handler(record=...,
    lambda_context=...)`` from Powertools' BatchProcessor."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    event_slot: int | str
    context: Any

    @classmethod
    def capture(cls, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        if args:
            slot: int | str = 0
        else:
            found = next((k for k in ("event", "record") if k in kwargs), None)
            if found is None:
                # What a Powertools event-handler route gets: path parameters, no event.
                raise ConfigurationError(
                    f"{name}() was called without an event"
                    + (f" (with {sorted(kwargs)})" if kwargs else "")
                    + f". {ROUTE_ADVICE}"
                )
            slot = found
        context = args[1] if len(args) > 1 else kwargs.get("lambda_context", kwargs.get("context"))
        if context is None:
            # A batch record handler is called without one unless it takes `lambda_context`;
            # the deadline and the handoff ARN are still the invocation's.
            context = current_lambda_context()
        return cls(args, kwargs, slot, context)

    @property
    def event(self) -> Any:
        if isinstance(self.event_slot, int):
            return self.args[self.event_slot]
        return self.kwargs[self.event_slot]

    def with_event(self, event: Any) -> _CallArgs:
        if isinstance(self.event_slot, int):
            return (event, *self.args[1:]), self.kwargs
        return self.args, {**self.kwargs, self.event_slot: event}


@dataclass(frozen=True)
class GuardOptions:
    """The decorator's settings, validated once at decoration time (see :func:`lease_owned`)."""

    ttl_ms: int
    renew_every_ms: int
    handoff: Handoff = "auto"
    handoff_margin_ms: int = DEFAULT_HANDOFF_MARGIN_MS
    queue_url: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_queue: int | None = None  # None: the provider's own bound
    on_poison: OnPoison = "skip"
    dead_letter_queue_url: str | None = None
    on_lost: Callable[[LeaseHandle], None] | None = None
    on_signal_error: Callable[[Signal, BaseException], None] | None = None
    signal_id_fn: Callable[[Any, Any], str] = signal_id
    lambda_client: Any = None
    sqs_client: Any = None

    @classmethod
    def build(
        cls,
        name: str,
        *,
        ttl_ms: int | None,
        renew_every_ms: int | None,
        handoff: str,
        handoff_margin_ms: int,
        queue_url: str | None,
        max_attempts: int | None,
        max_queue: int | None,
        on_poison: str,
        dead_letter_queue_url: str | None,
        on_lost: Callable[[LeaseHandle], None] | None,
        on_signal_error: Callable[[Signal, BaseException], None] | None,
        signal_id_fn: Callable[[Any, Any], str] | None,
        lambda_client: Any,
        sqs_client: Any,
    ) -> GuardOptions:
        try:
            ttl = check_ttl(ttl_ms if ttl_ms is not None else _env_int("LEASEGUARD_TTL_MS"))
            every = renew_every_ms if renew_every_ms is not None else max(ttl // 3, 1)
            every = check_positive_int("renew_every_ms", every, ttl - 1)
            if handoff_margin_ms != 0:
                check_positive_int("handoff_margin_ms", handoff_margin_ms, 900_000)
            attempts = check_positive_int(
                "max_attempts",
                max_attempts if max_attempts is not None else _env_int("LEASEGUARD_MAX_ATTEMPTS"),
                1000,
            )
            if max_queue is not None:
                check_positive_int("max_queue", max_queue, MAX_QUEUE_LIMIT)
        except InvalidLeaseArgument as exc:
            raise ConfigurationError(f"@lease_owned on {name}: {exc}") from exc
        if handoff not in HANDOFF_MODES:
            raise ConfigurationError(f"handoff must be one of {HANDOFF_MODES}, got {handoff!r}")
        if handoff == "sqs" and not queue_url:
            raise ConfigurationError('handoff="sqs" needs queue_url (the queue to hand off to)')
        if on_poison not in ON_POISON:
            raise ConfigurationError(f"on_poison must be one of {ON_POISON}, got {on_poison!r}")
        return cls(
            ttl_ms=ttl,
            renew_every_ms=every,
            handoff=cast(Handoff, handoff),
            handoff_margin_ms=handoff_margin_ms,
            queue_url=queue_url,
            max_attempts=attempts,
            max_queue=max_queue,
            on_poison=cast(OnPoison, on_poison),
            dead_letter_queue_url=dead_letter_queue_url,
            on_lost=on_lost,
            on_signal_error=on_signal_error,
            signal_id_fn=signal_id_fn or signal_id,
            lambda_client=lambda_client,
            sqs_client=sqs_client,
        )


class _Guard:
    """One guarded handler: its key function, provider, options and telemetry."""

    def __init__(
        self,
        handler: Callable[..., Any],
        key_fn: Callable[[Any], str] | str,
        provider: object | None,
        options: GuardOptions,
        telemetry: Telemetry,
    ) -> None:
        self.name = getattr(handler, "__qualname__", repr(handler))
        self.key_fn = _compile_key_fn(key_fn, self.name)
        if provider is not None and not (is_lease_provider(provider) and is_signal_queue(provider)):
            raise ConfigurationError(
                f"@lease_owned on {self.name}: provider must implement the lease contract and "
                f"the signal queue, got {type(provider).__name__}"
            )
        self._provider = cast("QueueProvider | None", provider)
        self.options = options
        self.telemetry = telemetry
        # The names the flow reads most, kept as attributes.
        self.ttl_ms = options.ttl_ms
        self.renew_every_ms = options.renew_every_ms
        self.handoff = options.handoff
        self.handoff_margin_ms = options.handoff_margin_ms
        self.queue_url = options.queue_url
        self.max_attempts = options.max_attempts
        self.on_lost = options.on_lost
        self.on_signal_error = options.on_signal_error
        self.signal_id_fn = options.signal_id_fn
        self.lambda_client = options.lambda_client
        self.sqs_client = options.sqs_client
        check_handler_stack(handler, self.name)  # Powertools decorators that must be outside

    @property
    def provider(self) -> QueueProvider:
        # Built on first use, not at import: tests and local runs set the environment first.
        if self._provider is None:
            self._provider = cast("QueueProvider", provider_from_env())
        return self._provider

    def key_of(self, event: Any) -> str:
        try:
            key = self.key_fn(event)
        except HandlerKeyError:
            raise
        except Exception as exc:
            raise HandlerKeyError(
                f"key function of {self.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(key, str) or not key:
            raise HandlerKeyError(
                f"key function of {self.name} returned {type(key).__name__} {key!r}; "
                "it must return a non-empty str"
            )
        try:
            return check_key(key)
        except InvalidLeaseArgument as exc:
            raise HandlerKeyError(f"key function of {self.name}: {exc}") from exc

    def can_dispatch(self, context: Any) -> bool:
        """Whether a remote handoff is possible: SQS configured, or a Lambda context that names
        this function."""
        if self.handoff == "inline":
            return False
        if self.queue_url:
            return True
        arn = getattr(context, "invoked_function_arn", None)
        return self.handoff != "sqs" and isinstance(arn, str) and bool(arn)

    def make_dispatcher(self, context: Any) -> Dispatcher:
        if self.queue_url and self.handoff in ("auto", "sqs"):
            return SqsDispatcher(self.queue_url, self.sqs_client)
        return InvokeDispatcher(context.invoked_function_arn, self.lambda_client)


class _Invocation:
    """One call of a guarded handler."""

    def __init__(self, guard: _Guard, call: _Call) -> None:
        self.guard = guard
        self.call = call
        self.event = call.event
        self.context = call.context
        self.telemetry = guard.telemetry

    def flow(self) -> Generator[_Run, _Outcome, Any]:
        guard = self.guard
        if self.context is None:
            _warn_without_context(guard)
        provider = guard.provider
        try:
            envelope = parse_envelope(self.event)
        except InvalidEnvelope as exc:
            self.telemetry.log(
                logging.WARNING, "rejected malformed handoff envelope", error=str(exc)
            )
            self.telemetry.count("HandoffRejected")
            return {"leaseguard": {"status": "rejected", "reason": str(exc)}}
        if envelope is not None:
            return (yield from self._receive(envelope))

        key = guard.key_of(self.event)
        own = Signal(guard.signal_id_fn(self.event, self.context), as_json(self.event))
        sent_at = time.monotonic()
        try:
            if guard.options.max_queue is None:
                result = provider.acquire_or_enqueue(key, own, guard.ttl_ms)
            else:
                result = provider.acquire_or_enqueue(  # type: ignore[call-arg]
                    key, own, guard.ttl_ms, max_queue=guard.options.max_queue
                )
        except QueueFull as full:
            return self._refuse(full)
        except PayloadTooLarge as large:
            if not is_api_gateway(self.event):
                raise
            self.telemetry.log(logging.WARNING, "refused an event: too large", error=str(large))
            return _http(413, {"leaseguard": {"status": "too large", "reason": str(large)}})
        if not result.acquired and result.position is None:
            # Already in flight (its owner runs it, or this is a second delivery of the event
            # that owns the key): running it here would run it twice.
            self.telemetry.count("DuplicateDelivery")
            return forwarded_response(
                self.event, _forwarded_body(key, own.id, result.owner, None, status="duplicate")
            )
        if not result.acquired:
            self.telemetry.count("LeaseForwarded")
            self.telemetry.log(
                logging.INFO,
                "forwarded event to the key's owner",
                lease_key=key,
                lease_holder=result.owner,
                queue_position=result.position,
                signal_id=own.id,
            )
            if result.position is not None:
                self.telemetry.count("QueueDepth", result.position)
            return forwarded_response(
                self.event, _forwarded_body(key, own.id, result.owner, result.position)
            )
        self.telemetry.count("LeaseAcquired")
        first = result.adopted or replace(own, token=result.token, attempts=result.attempts)
        return (
            yield from self._chain(
                key, first, sent_at, primary=own.id, own_event=result.adopted is None
            )
        )

    def _refuse(self, full: QueueFull) -> Any:
        """A forward into a full queue: HTTP 429 for API Gateway; anything else re-raises (a
        batch record handler's record then becomes a batch item failure and comes back)."""
        self.telemetry.count("QueueFull")
        self.telemetry.log(
            logging.WARNING,
            "refused an event: the key's queue is full",
            lease_key=full.key,
            lease_holder=full.holder,
            queue_depth=full.depth,
            max_queue=full.limit,
        )
        if not is_api_gateway(self.event):
            raise full
        body = {
            "leaseguard": {
                "status": "queue full",
                "key": full.key,
                "depth": full.depth,
                "max_queue": full.limit,
            }
        }
        return _http(429, body, {"retry-after": "1"})

    def _receive(self, envelope: Envelope) -> Generator[_Run, _Outcome, Any]:
        guard = self.guard
        sent_at = time.monotonic()
        signal = guard.provider.claim_signal(
            envelope.key, envelope.owner, envelope.token, guard.ttl_ms
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
            return {
                "leaseguard": {
                    "status": "rejected",
                    "reason": "grant not claimable",
                    "key": envelope.key,
                }
            }
        self.telemetry.count("LeaseAcquired")
        return (
            yield from self._chain(
                envelope.key, signal, sent_at, primary=signal.id, own_event=False
            )
        )

    def _chain(
        self, key: str, first: Signal, sent_at: float, *, primary: str, own_event: bool
    ) -> Generator[_Run, _Outcome, Any]:
        """Run ``first``, then each signal the lease is handed to while it can run inline.
        ``sent_at`` is when the request that granted ``first`` was sent."""
        guard, provider, telemetry = self.guard, self.guard.provider, self.telemetry
        primary_outcome: _Outcome | None = None
        longest_ms = 0.0
        current: Signal | None = first
        while current is not None:
            handle = LeaseHandle(
                provider,
                key,
                current.id,
                current.token,
                guard.ttl_ms,
                on_lost=self._lost_callback,
                sent_at=sent_at,
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
            if not platform_retries and current.attempts >= guard.max_attempts:
                # Its earlier runs all died before they could report (G5 counted each): one
                # more would most likely die the same way, so it is dead-lettered unrun.
                outcome = _Outcome(
                    error=UnfinishedRuns(
                        f"{current.attempts} earlier runs did not finish "
                        "(crash, timeout or lost lease)"
                    )
                )
            else:
                renewer = LeaseRenewer(handle, guard.renew_every_ms).start()
                started = time.monotonic()
                try:
                    outcome = yield _Run(event, handle)
                finally:
                    handle.settle()  # a TTL that ran out is the reason, not the stop below
                    renewer.stop()
                held_ms = (time.monotonic() - started) * 1000
                longest_ms = max(longest_ms, held_ms)
                telemetry.timing("LeaseHoldMs", held_ms)
            if is_primary:
                primary_outcome = outcome
            error = outcome.error
            if error is None and handle.take_failed:
                error = LeaseBackendError("take_signals failed during the run")
            dead: list[Signal] = []
            if error is not None:
                # The own event is the platform's to retry, unless this failure is its last
                # (its earlier failed deliveries count too): then it is dead-lettered here.
                last = current.attempts + 1 >= guard.max_attempts
                owned = [] if platform_retries and not last else [current]
                for signal in owned + handle.taken:
                    if self._signal_failed(key, signal, error, reported=not handle.settle()):
                        dead.append(signal)
                if platform_retries and outcome.error is None:
                    primary_outcome = _Outcome(error=error)
            if handle.settle():
                telemetry.count("LeaseLost")
                telemetry.log(
                    logging.ERROR,
                    "lease lost while the handler ran; not handing off",
                    lease_key=key,
                    lease_owner=handle.owner,
                    reason=handle.lost_reason,
                )
                break
            remote = self._hand_off_remotely(longest_ms)
            report: dict[str, Any] = {}
            if error is not None:
                report = {
                    "error": f"{type(error).__name__}: {error}",
                    "requeue_owner": not platform_retries,
                    "max_attempts": guard.max_attempts,
                }
                if guard.options.on_poison != "skip":
                    report["on_poison"] = guard.options.on_poison
            sent_at = time.monotonic()
            try:
                nxt = provider.transfer_to_next(
                    key, current.id, guard.ttl_ms, claim=not remote, token=handle.token, **report
                )
            except LeaseLostError as lost:
                # No holder at all: the lease expired, or the backend lost it (a Redis restart
                # without persistence), and then whatever was queued behind it went too.
                vanished = " (the key has no owner: expired, or lost by the backend)"
                handle.mark_lost(
                    "the lease expired or moved before the handoff"
                    + ("" if lost.holder else vanished)
                )
                telemetry.count("LeaseLost")
                telemetry.log(
                    logging.ERROR,
                    "lease lost before the handoff; not handing off",
                    lease_key=key,
                    lease_owner=handle.owner,
                    lease_holder=lost.holder,
                    pending_signals=_pending_or_none(provider, key),
                )
                break
            if dead and error is not None:
                self._send_dead_letters(key, dead, error)
            if nxt is None:
                break
            telemetry.count("LeaseHandedOff")
            if remote:
                self._dispatch(Envelope(key, nxt.id, nxt.token or 0, nxt.payload))
                break
            current = nxt

        if primary_outcome is None:
            # An adopted chain that had to stop before reaching this invocation's own event:
            # it stays queued and runs later, like any forwarded event.
            body = _forwarded_body(key, primary, None, None, status="queued")
            return forwarded_response(self.event, body)  # API Gateway: 202, never a raw body
        if primary_outcome.error is not None:
            if own_event:
                raise primary_outcome.error
            # A queued signal (a hand-off receiver's, or an adopted one): the backend retries or
            # dead-letters it; re-raising would only make Lambda resend a spent envelope.
            body = _forwarded_body(key, primary, None, None, status="failed, retried from queue")
            return forwarded_response(self.event, body)
        return primary_outcome.value

    def _hand_off_remotely(self, longest_ms: float) -> bool:
        """Inline while the deadline leaves the margin plus the longest run so far; the next
        run may well take as long as the slowest one did."""
        guard = self.guard
        if not guard.can_dispatch(self.context):
            if guard.handoff in ("invoke", "sqs"):
                self.telemetry.log(
                    logging.WARNING,
                    f'handoff="{guard.handoff}" is not possible '
                    "without a Lambda context; running the next signal inline",
                )
            return False
        if guard.handoff in ("invoke", "sqs"):
            return True
        remaining = _remaining_ms(self.context)
        return remaining is not None and remaining - guard.handoff_margin_ms <= longest_ms

    def _dispatch(self, envelope: Envelope) -> None:
        try:
            self.guard.make_dispatcher(self.context).dispatch(envelope)
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

    def _send_dead_letters(self, key: str, dead: list[Signal], error: BaseException) -> None:
        """Copies of what was just dead-lettered on the key, to ``dead_letter_queue_url``. The
        key keeps every dead letter either way, so a failed send loses nothing."""
        url = self.guard.options.dead_letter_queue_url
        if not url:
            return
        for signal in dead:
            body = {
                "leaseguard": "dead-letter",
                "key": key,
                "id": signal.id,
                "attempts": signal.attempts + 1,
                "error": f"{type(error).__name__}: {error}",
                "enqueued_at_ms": signal.enqueued_at_ms,
                "failed_at_ms": now_ms(),
                "payload": signal.payload,
            }
            try:
                client = self.guard.sqs_client or _default_sqs_client()
                client.send_message(QueueUrl=url, MessageBody=json.dumps(body))
            except Exception as exc:
                self.telemetry.count("DeadLetterSendFailed")
                self.telemetry.log(
                    logging.ERROR,
                    "could not copy a dead letter to dead_letter_queue_url; it stays on the key",
                    lease_key=key,
                    signal_id=signal.id,
                    error=str(exc),
                )

    def _signal_failed(
        self, key: str, signal: Signal, error: BaseException, *, reported: bool
    ) -> bool:
        """``reported``: the failure goes to the backend with the hand-off (not when the lease
        was lost first: then the signal is simply delivered again after the lease expires).
        True when the report dead-letters it."""
        dead = reported and signal.attempts + 1 >= self.guard.max_attempts
        self.telemetry.count("SignalDeadLettered" if dead else "SignalFailed")
        if not reported:
            outcome = "the lease was lost: it is delivered again once the lease expires"
        elif dead:
            outcome = "dead-lettered"
        else:
            outcome = "it goes back to the head of the queue"
        self.telemetry.log(
            logging.ERROR,
            f"handler failed on a signal; {outcome}",
            lease_key=key,
            signal_id=signal.id,
            attempts=signal.attempts + 1,
            error=f"{type(error).__name__}: {error}",
        )
        callback = self.guard.on_signal_error
        if callback is not None:
            try:
                callback(signal, error)
            except Exception:
                logging.getLogger("leaseguard").exception("on_signal_error callback failed")
        return dead

    def _lost_callback(self, handle: LeaseHandle) -> None:
        self.telemetry.log(
            logging.WARNING,
            "lease lost",
            lease_key=handle.key,
            lease_owner=handle.owner,
            reason=handle.lost_reason,
        )
        if self.guard.on_lost is not None:
            self.guard.on_lost(handle)


def _forwarded_body(
    key: str, signal: str, holder: str | None, position: int | None, status: str = "forwarded"
) -> dict[str, Any]:
    return {
        "leaseguard": {
            "status": status,
            "key": key,
            "signal_id": signal,
            "holder": holder,
            "position": position,
        }
    }


def _http(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return {
        "statusCode": status,
        "headers": {"content-type": "application/json", **(headers or {})},
        "body": json.dumps(body),
    }


def _default_sqs_client() -> Any:
    from leaseguard import aws

    return aws.default_client("sqs")


def _pending_or_none(provider: QueueProvider, key: str) -> int | None:
    """How many signals still wait on ``key``, for a log line (``None`` if the backend cannot
    say): after a lost lease it tells an operator whether work was left behind or lost."""
    try:
        return provider.pending_signals(key)
    except Exception:
        return None


_WARNED_NO_CONTEXT: weakref.WeakSet[_Guard] = weakref.WeakSet()


def _warn_without_context(guard: _Guard) -> None:
    """Once per guarded handler: with no Lambda context the owner cannot see the deadline, so
    it would drain its whole queue inline, however long that takes."""
    if guard.handoff == "inline" or guard in _WARNED_NO_CONTEXT:
        return
    _WARNED_NO_CONTEXT.add(guard)
    guard.telemetry.log(
        logging.WARNING,
        f"{guard.name} was called without a Lambda context: the owner cannot see the "
        "deadline and hands off inline only. Pass the context, or decorate the lambda_handler "
        "with leaseguard.batch.handle_envelopes",
    )


def _remaining_ms(context: Any) -> int | None:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(remaining):
        return None
    value = remaining()
    return int(value) if isinstance(value, (int, float)) else None


_ENV_DEFAULTS = {
    "LEASEGUARD_TTL_MS": DEFAULT_TTL_MS,
    "LEASEGUARD_MAX_ATTEMPTS": DEFAULT_MAX_ATTEMPTS,
}


def _env_int(name: str) -> int:
    raw = os.environ.get(name)
    if not raw:
        return _ENV_DEFAULTS[name]
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from exc


def _compile_key_fn(key_fn: Callable[[Any], str] | str, name: str) -> Callable[[Any], Any]:
    if callable(key_fn):
        return key_fn
    if not isinstance(key_fn, str) or not key_fn:
        raise ConfigurationError(
            f"@lease_owned on {name}: key_fn must be a callable or a JMESPath string"
        )
    import jmespath
    from jmespath.exceptions import JMESPathError

    try:
        expression = jmespath.compile(key_fn)
    except JMESPathError as exc:
        raise ConfigurationError(f"@lease_owned on {name}: bad JMESPath {key_fn!r}: {exc}") from exc

    def search(event: Any) -> Any:
        found = expression.search(as_json(event))
        if found is None:
            raise HandlerKeyError(f"key function of {name}: nothing at {key_fn!r} in the event")
        return found

    return search


@contextmanager
def _lease_scope(invocation: _Invocation, request: _Run) -> Iterator[_CallArgs]:
    """While one handler run lasts: ``current_lease()`` answers, log lines carry the lease."""
    handle = request.handle
    with (
        lease_scope(handle),
        invocation.telemetry.lease_context(handle.key, handle.owner, handle.token),
    ):
        yield invocation.call.with_event(request.event)


def _finish(invocation: _Invocation, flow: Generator[_Run, _Outcome, Any]) -> None:
    flow.close()  # a BaseException mid-run still stops and joins the renewer
    invocation.telemetry.flush()


# The two drivers differ only in `await`: Python cannot share the loop between them.
def _drive_sync(fn: Callable[..., Any], invocation: _Invocation) -> Any:
    flow = invocation.flow()
    try:
        request = next(flow)
        while True:
            try:
                with _lease_scope(invocation, request) as (args, kwargs):
                    outcome = _Outcome(value=fn(*args, **kwargs))
            except Exception as exc:
                outcome = _Outcome(error=exc)
            request = flow.send(outcome)
    except StopIteration as done:
        return done.value
    finally:
        _finish(invocation, flow)


_DONE = object()


def _step(flow: Generator[_Run, _Outcome, Any], outcome: _Outcome | None) -> tuple[Any, Any]:
    """One step of the flow: ``(request, _DONE)``, or ``(None, result)`` once it returned
    (StopIteration cannot cross into an asyncio future)."""
    try:
        request = next(flow) if outcome is None else flow.send(outcome)
    except StopIteration as done:
        return None, done.value
    return request, _DONE


async def _drive_async(fn: Callable[..., Any], invocation: _Invocation) -> Any:
    """The flow's steps (backend calls, joining the renewer) run on a worker thread, so the
    event loop keeps serving other tasks while this one waits on the backend."""
    import asyncio

    flow = invocation.flow()
    try:
        request, result = await asyncio.to_thread(_step, flow, None)
        while result is _DONE:
            try:
                with _lease_scope(invocation, request) as (args, kwargs):
                    outcome = _Outcome(value=await fn(*args, **kwargs))
            except Exception as exc:
                outcome = _Outcome(error=exc)
            request, result = await asyncio.to_thread(_step, flow, outcome)
        return result
    finally:
        await asyncio.to_thread(_finish, invocation, flow)


def lease_owned(
    key_fn: Callable[[Any], str] | str,
    provider: object | None = None,
    ttl_ms: int | None = None,
    renew_every_ms: int | None = None,
    handoff: Handoff = "auto",
    *,
    handoff_margin_ms: int = DEFAULT_HANDOFF_MARGIN_MS,
    queue_url: str | None = None,
    on_lost: Callable[[LeaseHandle], None] | None = None,
    on_signal_error: Callable[[Signal, BaseException], None] | None = None,
    signal_id_fn: Callable[[Any, Any], str] | None = None,
    lambda_client: Any = None,
    sqs_client: Any = None,
    logger: Any = None,
    metrics: Any = None,
    tracer: Any = None,
    max_attempts: int | None = None,
    max_queue: int | None = None,
    on_poison: OnPoison = "skip",
    dead_letter_queue_url: str | None = None,
) -> Callable[[F], F]:
    """Guard a Lambda handler (or a Powertools batch record handler) with a lease on
    ``key_fn(event)``.

    ``key_fn`` is a callable on the event or a JMESPath expression
    (``"pathParameters.threadId"``). ``provider`` defaults to the one ``LEASEGUARD_*``
    environment variables describe. ``ttl_ms`` defaults to ``LEASEGUARD_TTL_MS`` or 15 s and
    the lease is renewed every ``renew_every_ms`` (default ``ttl_ms // 3``).

    ``handoff`` decides how the next queued signal runs when the handler finishes:
    ``"auto"`` runs it inline while the Lambda deadline leaves ``handoff_margin_ms`` more than
    the longest handler run so far, else hands off by SQS (when ``queue_url`` is set) or by an
    async ``Invoke`` of this function; ``"inline"``, ``"invoke"`` and ``"sqs"`` force one way.

    ``on_lost(handle)`` runs when renewal fails; ``on_signal_error(signal, exc)`` when the
    handler raises on a forwarded signal, or on a run that had taken it with
    ``take_signals``: such a signal goes back to the head of the key's queue and is retried,
    and after ``max_attempts`` (default ``LEASEGUARD_MAX_ATTEMPTS`` or 3) failed runs it is
    dead-lettered on the key (``inspect_key(key).dead_letters``, ``leaseguard redrive``), and
    also sent to ``dead_letter_queue_url`` (an SQS queue) when set. A run that never finished
    (a crash, a timeout) counts as a failed one. ``on_poison="skip"`` lets the key move on past
    a dead letter; ``"halt"`` keeps strict order: nothing queued behind it runs until it is
    redriven. The invocation's own event re-raises instead, so Lambda's (or SQS's) retry
    applies.

    ``max_queue`` (default: the provider's, ``LEASEGUARD_MAX_QUEUE`` or 1,000) bounds each
    key's queue: a forward into a full one raises :class:`~leaseguard.errors.QueueFull`
    (API Gateway gets HTTP 429; a Powertools batch record handler's record is reported as a
    batch item failure, so SQS delivers it again later). ``logger``, ``metrics`` and ``tracer``
    take Powertools objects.
    """

    def decorate(fn: F) -> F:
        name = getattr(fn, "__qualname__", repr(fn))
        options = GuardOptions.build(
            name,
            ttl_ms=ttl_ms,
            renew_every_ms=renew_every_ms,
            handoff=handoff,
            handoff_margin_ms=handoff_margin_ms,
            queue_url=queue_url,
            max_attempts=max_attempts,
            max_queue=max_queue,
            on_poison=on_poison,
            dead_letter_queue_url=dead_letter_queue_url,
            on_lost=on_lost,
            on_signal_error=on_signal_error,
            signal_id_fn=signal_id_fn,
            lambda_client=lambda_client,
            sqs_client=sqs_client,
        )
        telemetry = Telemetry(logger=logger, metrics=metrics, tracer=tracer)
        guard = _Guard(fn, key_fn, provider, options, telemetry)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                check_not_inside_idempotency(guard, guard.name)  # before the backend is touched
                call = _Call.capture(guard.name, args, kwargs)
                return await _drive_async(fn, _Invocation(guard, call))

            async_wrapper.__leaseguard__ = guard  # type: ignore[attr-defined]
            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            check_not_inside_idempotency(guard, guard.name)  # before the backend is touched
            return _drive_sync(fn, _Invocation(guard, _Call.capture(guard.name, args, kwargs)))

        wrapper.__leaseguard__ = guard  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate
