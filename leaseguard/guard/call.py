"""How a guarded handler was called, so it can be called the same way with another event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leaseguard.batch import current_lambda_context
from leaseguard.errors import ConfigurationError
from leaseguard.stacking import ROUTE_ADVICE

CallArgs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Call:
    """``handler(event, context)`` from Lambda, ``record_handler(record=...,
    lambda_context=...)`` from Powertools' BatchProcessor: where the event sits (``event_slot``)
    and the invocation's Lambda context."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    event_slot: int | str
    context: Any

    @classmethod
    def capture(cls, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
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

    def with_event(self, event: Any) -> CallArgs:
        if isinstance(self.event_slot, int):
            return (event, *self.args[1:]), self.kwargs
        return self.args, {**self.kwargs, self.event_slot: event}
