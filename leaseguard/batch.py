"""Guarded Powertools batch record handlers: the Lambda context they are not given, and the
handoff envelopes that reach an SQS-triggered function by ``Invoke``.

Powertools' ``process_partial_response(event, record_handler, processor, context)`` calls
``record_handler(record)`` without the context unless the handler has a ``lambda_context``
parameter. The guard still needs it: the context holds the deadline the owner must stop
draining before, and the function ARN a handoff ``Invoke`` goes to. The guard finds it, in
this order:

1. the call itself: ``handler(event, context)``, or ``record_handler(record, lambda_context)``;
2. the invocation's context set by :func:`handle_envelopes` on the ``lambda_handler`` (a
   ``ContextVar``, so threads and asyncio tasks each see their own);
3. the Powertools batch processor that is calling the record handler right now: it keeps the
   ``lambda_context`` that ``process_partial_response`` was given (read as the record handler
   is called; Lambda runs one invocation at a time per execution environment, so a processor
   shared by the module holds the current invocation's context).

With none of them the owner cannot see a deadline and drains its queue inline; the guard logs
a warning once per handler.

When the owner has to hand the rest of its queue to a new invocation by ``Invoke``, that
invocation's event is a handoff envelope, not an SQS batch: ``process_partial_response`` would
reject it (``UnexpectedBatchTypeError``). :func:`handle_envelopes` turns such an event into a
one-record SQS batch whose body is the envelope, so it goes through the function's own batch
processor to the guarded record handler, which claims the grant and runs the stored record (as
an ``SQSRecord``, like every other record)::

    @handle_envelopes
    def lambda_handler(event, context):
        return process_partial_response(event, record_handler, processor, context)
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from leaseguard.handoff import ENVELOPE_FIELD

F = TypeVar("F", bound=Callable[..., Any])

_CONTEXT: ContextVar[Any] = ContextVar("leaseguard_lambda_context", default=None)
_BATCH_MODULE = "aws_lambda_powertools.utilities.batch"
_PROCESSOR_FRAMES = ("_process_record", "_async_process_record")
_MAX_FRAMES = 16  # the processor calls the record handler a few frames above the guard


@contextmanager
def invocation_context(context: Any) -> Iterator[None]:
    """While inside, a guarded handler called without a context uses ``context`` (the one
    Lambda gave the invocation) for its deadline and handoffs."""
    reset = _CONTEXT.set(context)
    try:
        yield
    finally:
        _CONTEXT.reset(reset)


def current_lambda_context() -> Any:
    """The Lambda context of the running invocation, for a guarded handler that was not given
    one: set by :func:`handle_envelopes` or :func:`invocation_context`, else the one the
    Powertools batch processor calling this record handler holds. ``None`` if neither."""
    context = _CONTEXT.get()
    if context is not None:
        return context
    return _processor_context(sys._getframe(1))


def _processor_context(frame: Any) -> Any:
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name in _PROCESSOR_FRAMES and str(
            frame.f_globals.get("__name__", "")
        ).startswith(_BATCH_MODULE):
            processor = frame.f_locals.get("self")
            return getattr(processor, "lambda_context", None)
        frame = frame.f_back
    return None


def is_envelope_event(event: Any) -> bool:
    """An async-invoke handoff event (``{"leaseguard_handoff": {...}}``), well-formed or not."""
    return isinstance(event, dict) and ENVELOPE_FIELD in event


def envelope_batch(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """A one-record SQS batch carrying the handoff envelope ``event`` as its body: what a
    Powertools SQS batch processor accepts and a guarded record handler recognises (an
    envelope that came through an SQS queue looks exactly like this)."""
    import hashlib  # here, not at import: OpenSSL's load is a cold-start cost few calls need

    body = json.dumps(event, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()[:32]
    region = getattr(context, "invoked_function_arn", "") or ""
    parts = region.split(":")
    return {
        "Records": [
            {
                "messageId": f"leaseguard-handoff-{digest}",
                "receiptHandle": "",
                "body": body,
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "md5OfBody": hashlib.md5(body.encode(), usedforsecurity=False).hexdigest(),
                "eventSource": "aws:sqs",
                "eventSourceARN": "leaseguard:handoff",
                "awsRegion": parts[3] if len(parts) > 3 else "",
            }
        ]
    }


def handle_envelopes(lambda_handler: F) -> F:
    """Decorate the ``lambda_handler`` of an SQS-triggered function whose record handler is
    guarded by ``@lease_owned``.

    * A handoff envelope delivered by ``Invoke`` is passed on as a one-record SQS batch (see
      :func:`envelope_batch`), so ``process_partial_response`` accepts it and the guarded record
      handler claims the grant and runs the stored record.
    * For the whole invocation, a guarded record handler called without a context
      (``record_handler(record)``) sees this invocation's context: its owner stops draining
      before the deadline and hands the rest off.

    Other events pass through unchanged. Works on ``async def`` handlers too.
    """
    if inspect.iscoroutinefunction(lambda_handler):

        @functools.wraps(lambda_handler)
        async def async_wrapper(event: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
            if is_envelope_event(event):
                event = envelope_batch(event, context)
            with invocation_context(context):
                return await lambda_handler(event, context, *args, **kwargs)

        return cast(F, async_wrapper)

    @functools.wraps(lambda_handler)
    def wrapper(event: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
        if is_envelope_event(event):
            event = envelope_batch(event, context)
        with invocation_context(context):
            return lambda_handler(event, context, *args, **kwargs)

    return cast(F, wrapper)
