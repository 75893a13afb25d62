"""``@lease_owned``, the decorator: it builds a :class:`GuardedHandler` and picks a driver."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from leaseguard.observability import Telemetry
from leaseguard.providers.base import OnPoison
from leaseguard.renewal import LeaseHandle
from leaseguard.stacking import check_not_inside_idempotency
from leaseguard.types import Signal

from .call import Call
from .drivers import drive_async, drive_sync
from .flow import Invocation
from .handler import GuardedHandler
from .options import DEFAULT_HANDOFF_MARGIN_MS, GuardOptions, Handoff

F = TypeVar("F", bound=Callable[..., Any])


def lease_owned(
    key_fn: Callable[[Any], str] | str,
    provider: object | None = None,
    ttl_ms: int | None = None,
    renew_every_ms: int | None = None,
    handoff: Handoff = "auto",
    *,
    handoff_margin_ms: int = DEFAULT_HANDOFF_MARGIN_MS,
    caller_waits: bool | None = None,
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
    drain_batch: int | None = None,
    retry_delay_ms: int | None = None,
    retry_max_delay_ms: int | None = None,
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
    When the invocation's caller waits for its answer, ``"auto"`` runs nothing after its own
    event: the next signal is handed off at once, so the caller is answered after its own run
    (inline only when no hand-off is possible: no ``queue_url`` and a context naming no
    function; a warning says so). ``caller_waits`` says whose caller waits: ``None`` (the
    default) the event's source decides: API Gateway REST and HTTP APIs, function URLs and ALB
    wait, every other source (SQS, async ``Invoke``, streams, hand-off envelopes) does not.
    A synchronous (``RequestResponse``) ``Invoke`` looks like an async one to the function, so
    a function invoked that way says ``caller_waits=True``; ``False`` drains inline under the
    deadline for every source.

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

    ``retry_delay_ms`` (default ``LEASEGUARD_RETRY_DELAY_MS`` or 0: at once) is how long a
    failed signal waits before its next run, doubled after each further failure up to
    ``retry_max_delay_ms`` (default 300,000; at most 900,000), with jitter. No invocation waits
    for it: the signal's envelope goes by SQS with that delay when ``queue_url`` is set, else
    the grant that holds the key for it runs out after the delay and the key's next event or
    the sweeper runs it (:mod:`leaseguard.guard.retries`). Events behind it wait their turn.

    ``max_queue`` (default: the provider's, ``LEASEGUARD_MAX_QUEUE`` or 1,000) bounds each
    key's queue: a forward into a full one raises :class:`~leaseguard.errors.QueueFull`
    (API Gateway gets HTTP 429; a Powertools batch record handler's record is reported as a
    batch item failure, so SQS delivers it again later). ``logger``, ``metrics`` and ``tracer``
    take Powertools objects.

    ``drain_batch`` (default ``LEASEGUARD_DRAIN_BATCH`` or 0, off: the signals of a batch
    share one fencing token): an owner whose run succeeded and whose next signal would run
    inline takes up to this many queued signals in one backend call and runs them one by one
    under its own grant (its token), then reports them all with one hand-off. A failure stops
    the batch: the signals before it are done, the failed one is retried first (or
    dead-lettered), the rest keep their place and attempts.
    """

    def decorate(fn: F) -> F:
        name = getattr(fn, "__qualname__", repr(fn))
        options = GuardOptions.build(
            name,
            ttl_ms=ttl_ms,
            renew_every_ms=renew_every_ms,
            handoff=handoff,
            handoff_margin_ms=handoff_margin_ms,
            caller_waits=caller_waits,
            queue_url=queue_url,
            max_attempts=max_attempts,
            max_queue=max_queue,
            drain_batch=drain_batch,
            retry_delay_ms=retry_delay_ms,
            retry_max_delay_ms=retry_max_delay_ms,
            on_poison=on_poison,
            dead_letter_queue_url=dead_letter_queue_url,
            on_lost=on_lost,
            on_signal_error=on_signal_error,
            signal_id_fn=signal_id_fn,
            lambda_client=lambda_client,
            sqs_client=sqs_client,
        )
        telemetry = Telemetry(logger=logger, metrics=metrics, tracer=tracer)
        guard = GuardedHandler(fn, key_fn, provider, options, telemetry)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                __tracebackhide__ = True  # pytest hides this frame
                check_not_inside_idempotency(guard, guard.name)  # before the backend is touched
                invocation = Invocation(guard, Call.capture(guard.name, args, kwargs))
                try:
                    return await drive_async(fn, invocation)
                except Exception as exc:
                    handler_tb = invocation.handler_errors.traceback_of(exc)
                    if handler_tb is None:
                        raise
                    # the same exception, cause and context: only the guard's frames are cut
                    raise exc.with_traceback(handler_tb)  # noqa: B904

            async_wrapper.__leaseguard__ = guard  # type: ignore[attr-defined]
            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # pytest hides this frame
            check_not_inside_idempotency(guard, guard.name)  # before the backend is touched
            invocation = Invocation(guard, Call.capture(guard.name, args, kwargs))
            try:
                return drive_sync(fn, invocation)
            except Exception as exc:
                handler_tb = invocation.handler_errors.traceback_of(exc)
                if handler_tb is None:
                    raise
                # the same exception, cause and context: only the guard's frames are cut
                raise exc.with_traceback(handler_tb)  # noqa: B904

        wrapper.__leaseguard__ = guard  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate
