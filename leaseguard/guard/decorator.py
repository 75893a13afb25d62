"""``@lease_owned``, the decorator: it builds a :class:`GuardedHandler` and picks a driver."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from leaseguard.observability import Telemetry
from leaseguard.renewal import LeaseHandle
from leaseguard.stacking import check_not_inside_idempotency
from leaseguard.types import Signal

from .call import Call
from .drivers import drive_async, drive_sync
from .flow import Invocation
from .handler import GuardedHandler
from .options import GuardOptions, Handoff, HandoffConfig, RetryConfig, grouped

F = TypeVar("F", bound=Callable[..., Any])


def lease_owned(
    key_fn: Callable[[Any], str] | str,
    provider: object | None = None,
    ttl_ms: int | None = None,
    renew_every_ms: int | None = None,
    handoff: Handoff | HandoffConfig = "auto",
    *,
    retries: RetryConfig | None = None,
    max_queue: int | None = None,
    signal_id_fn: Callable[[Any, Any], str] | None = None,
    on_lost: Callable[[LeaseHandle], None] | None = None,
    on_signal_error: Callable[[Signal, BaseException], None] | None = None,
    logger: Any = None,
    metrics: Any = None,
    tracer: Any = None,
    **deprecated: Any,
) -> Callable[[F], F]:
    """Guard a Lambda handler (or a Powertools batch record handler) with a lease on
    ``key_fn(event)``.

    Parameters
    ----------
    key_fn : callable or str
        The key of an event: a callable on the event, or a JMESPath expression
        (``"pathParameters.threadId"``); it must give a non-empty ``str``.
    provider : optional
        The lease backend; default: the one the ``LEASEGUARD_*`` environment variables
        describe, looked up at each invocation.
    ttl_ms : int, optional
        The lease's TTL; default ``LEASEGUARD_TTL_MS`` or 15 s.
    renew_every_ms : int, optional
        The renewal period; default ``ttl_ms // 3``.
    handoff : {"auto", "inline", "invoke", "sqs"} or HandoffConfig
        How the next queued event runs when a run ends (:class:`HandoffConfig`: the mode, the
        deadline's margin, the SQS queue, whose caller waits, batch drains). With ``"auto"``
        an invocation whose caller waits for its answer (API Gateway, function URLs, ALB) runs
        nothing after its own event: the rest is handed off, so the caller is answered after
        its own run.
    retries : RetryConfig, optional
        What happens to a forwarded event whose run failed: attempts, the retry delay, poison
        handling, a dead-letter queue (:class:`RetryConfig`). The invocation's own event
        re-raises instead, so its platform retries it.
    max_queue : int, optional
        Default: the provider's (``LEASEGUARD_MAX_QUEUE`` or 1,000). A forward into a key
        with this many queued raises :class:`~leaseguard.errors.QueueFull` (API Gateway gets
        HTTP 429; a Powertools batch record handler's record becomes a batch item failure).
    signal_id_fn : callable, optional
        ``signal_id_fn(event, context)``: the id an event is stored under (default: SQS
        ``messageId``, stream ``eventID``, else the request id); retries of one delivery
        must share it.
    on_lost : callable, optional
        ``on_lost(handle)``, called once when the lease is lost.
    on_signal_error : callable, optional
        ``on_signal_error(signal, exc)``, called when the handler raised on a forwarded event
        (or on a run that had taken it with ``take_signals``).
    logger, metrics, tracer : optional
        Powertools objects (README, "Powertools Logger, Metrics, Tracer and idempotency").

    The keywords of 0.1 (``handoff_margin_ms``, ``queue_url``, ``drain_batch``,
    ``lambda_client``, ``sqs_client``, ``max_attempts``, ``on_poison``,
    ``dead_letter_queue_url``) still work, each with a ``DeprecationWarning`` naming its
    group's field.
    """

    def decorate(fn: F) -> F:
        name = getattr(fn, "__qualname__", repr(fn))
        handoff_group, retry_group = grouped(name, handoff, retries, deprecated)
        options = GuardOptions.build(
            name,
            ttl_ms=ttl_ms,
            renew_every_ms=renew_every_ms,
            handoff=handoff_group,
            retries=retry_group,
            max_queue=max_queue,
            on_lost=on_lost,
            on_signal_error=on_signal_error,
            signal_id_fn=signal_id_fn,
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
