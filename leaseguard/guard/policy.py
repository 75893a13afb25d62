"""Where the next signal runs once the handler finishes: inline, or in a new invocation."""

from __future__ import annotations

from typing import Any, Literal

from leaseguard.events import caller_waits
from leaseguard.handoff import DelayedDispatcher, Dispatcher, InvokeDispatcher, SqsDispatcher

from .options import GuardOptions

Placement = Literal["inline", "remote", "inline, cannot dispatch"]


class HandoffPolicy:
    """The ``handoff`` setting applied to one invocation's Lambda context.

    ``"auto"`` runs the next signal inline while the deadline leaves the margin plus the longest
    run so far (the next run may well take as long as the slowest one did), else hands it off by
    SQS when ``queue_url`` is set or by an async Invoke of this function. Once the invocation's
    own event has run and its caller waits for the answer (:meth:`waits`), ``"auto"`` hands off
    whatever the deadline: running other callers' events inline would hold that answer back.
    ``"invoke"`` and ``"sqs"`` always hand off, ``"inline"`` never does.
    """

    def __init__(self, options: GuardOptions) -> None:
        self.mode = options.handoff.mode
        self.margin_ms = options.handoff.margin_ms
        self.caller_waits = options.handoff.caller_waits
        self.queue_url = options.handoff.queue_url
        self.lambda_client = options.handoff.lambda_client
        self.sqs_client = options.handoff.sqs_client

    def waits(self, event: Any) -> bool:
        """Whether the caller of an invocation of ``event`` waits for its answer: the
        ``caller_waits`` setting, else the event's source (API Gateway, function URLs, ALB)."""
        if self.caller_waits is not None:
            return self.caller_waits
        return caller_waits(event)

    def can_dispatch(self, context: Any) -> bool:
        """SQS is configured, or a Lambda context names this function (for the Invoke)."""
        if self.mode == "inline":
            return False
        if self.queue_url:
            return True
        arn = getattr(context, "invoked_function_arn", None)
        return self.mode != "sqs" and isinstance(arn, str) and bool(arn)

    def place_next(self, context: Any, longest_ms: float, *, answered: bool = False) -> Placement:
        """Where the next signal runs; ``"inline, cannot dispatch"`` when the mode asks for a
        new invocation that this context cannot make (the caller says so in the log).
        ``answered``: the invocation's own event ran and its caller waits for the answer."""
        hands_off = self.mode in ("invoke", "sqs") or (self.mode == "auto" and answered)
        if not self.can_dispatch(context):
            return "inline, cannot dispatch" if hands_off else "inline"
        if hands_off:
            return "remote"
        remaining = remaining_ms(context)
        if remaining is not None and remaining - self.margin_ms <= longest_ms:
            return "remote"
        return "inline"

    def delayed_dispatcher(self, context: Any) -> DelayedDispatcher | None:
        """The dispatcher that sends an envelope to arrive after a delay (SQS, a standard
        queue), if this mode hands off by one; else ``None``: a retry waits for its grant to
        run out instead (:mod:`leaseguard.guard.retries`)."""
        if self.mode == "inline" or not self.can_dispatch(context):
            return None
        dispatcher = self.dispatcher(context)
        if isinstance(dispatcher, DelayedDispatcher) and dispatcher.can_delay:
            return dispatcher
        return None

    def dispatcher(self, context: Any) -> Dispatcher:
        if self.queue_url and self.mode in ("auto", "sqs"):
            return SqsDispatcher(self.queue_url, self.sqs_client)
        return InvokeDispatcher(context.invoked_function_arn, self.lambda_client)


def remaining_ms(context: Any) -> int | None:
    """The invocation's time left, or ``None`` without a Lambda context."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(remaining):
        return None
    value = remaining()
    return int(value) if isinstance(value, (int, float)) else None
