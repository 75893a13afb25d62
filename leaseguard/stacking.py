"""Where ``@lease_owned`` goes among Powertools' decorators, checked rather than documented only.

The supported stack on a Lambda handler::

    @logger.inject_lambda_context(clear_state=True)   # outside: sets up logging first
    @tracer.capture_lambda_handler                    # outside: one trace per invocation
    @metrics.log_metrics                              # outside: flushes every path's metrics
    @lease_owned(key_fn, logger=logger, metrics=metrics, tracer=tracer)
    @idempotent(persistence_store=persistence)        # inside: caches the real result
    def lambda_handler(event, context): ...

The other orders break silently, so they raise :class:`~leaseguard.errors.ConfigurationError`:

* ``@lease_owned`` over ``inject_lambda_context(clear_state=True)``: every run clears the
  logger's state, the lease keys with it, so the handler's lines lose ``lease_key`` and
  ``fencing_token`` (checked when ``@lease_owned`` is applied);
* ``@lease_owned`` over ``log_metrics``: a forwarded invocation never runs the handler, so its
  ``LeaseForwarded`` is never flushed (checked when ``@lease_owned`` is applied);
* ``@idempotent`` (or ``@idempotent_function``) over ``@lease_owned``: the ``202 forwarded``
  answer would be stored as the event's final result, and the owner's real run of it is never
  recorded (checked at the first invocation, before the backend is touched: ``idempotent`` is
  applied after ``@lease_owned``, so only the call shows it).

``@tracer.capture_lambda_handler`` goes outside too (not checked: inside, it would still work):
outside, its ``## handler`` subsegment spans the whole invocation (the lease steps, a forward,
the inline hand-offs) and holds the ``lease_key`` and ``fencing_token`` annotations ``tracer=``
adds; inside, a forwarded invocation has no subsegment of its own and each inline hand-off's run
one more.

A Powertools event-handler route (``@app.get(...)``) cannot be guarded: the resolver calls it
with path parameters, not the event. Guard the ``lambda_handler`` that calls
``app.resolve(event, context)`` instead (:data:`ROUTE_ADVICE`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from leaseguard.errors import ConfigurationError

RECOMMENDED_STACK = (
    "from the top: @logger.inject_lambda_context(clear_state=True), "
    "@tracer.capture_lambda_handler, @metrics.log_metrics, @lease_owned(...), and "
    "@idempotent(...) nearest the function"
)
ROUTE_ADVICE = (
    "@lease_owned guards a Lambda handler(event, context) or a Powertools batch "
    "record_handler(record); a Powertools event-handler route (app.get/app.post ...) is called "
    "with path parameters, not the event. Guard the lambda_handler instead: "
    '@lease_owned("pathParameters.threadId") def lambda_handler(event, context): '
    "return app.resolve(event, context)"
)
_LOGGER_DECORATOR = "Logger.inject_lambda_context.<locals>.decorate"
_METRICS_DECORATOR = "log_metrics.<locals>.decorate"
_IDEMPOTENCY_MODULE = "aws_lambda_powertools.utilities.idempotency"
_MAX_FRAMES = 24


def _layers(fn: Any) -> Iterator[Any]:
    """``fn`` and each function it wraps (``functools.wraps`` sets ``__wrapped__``)."""
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        yield fn
        fn = getattr(fn, "__wrapped__", None)


def _closure(fn: Any) -> dict[str, Any]:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    values: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, cells, strict=False):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return values


def _qualname(fn: Any) -> str:
    code = getattr(fn, "__code__", None)
    return str(getattr(code, "co_qualname", "")) if code is not None else ""


def check_handler_stack(handler: Callable[..., Any], name: str) -> None:
    """Raise :class:`ConfigurationError` if ``handler`` (what ``@lease_owned`` is applied to)
    already carries a Powertools decorator that must sit outside ``@lease_owned``."""
    for layer in _layers(handler):
        qualname = _qualname(layer)
        if qualname == _LOGGER_DECORATOR and _closure(layer).get("clear_state"):
            raise ConfigurationError(
                f"@lease_owned on {name} is outside (above) "
                "@logger.inject_lambda_context(clear_state=True): each run of the handler would "
                "clear the lease keys (lease_key, fencing_token) from its log lines. Put "
                "@logger.inject_lambda_context above @lease_owned, so that it wraps it: "
                f"{RECOMMENDED_STACK}"
            )
        if qualname.endswith(_METRICS_DECORATOR) and "aws_lambda_powertools" in str(
            getattr(layer.__code__, "co_filename", "")
        ):
            raise ConfigurationError(
                f"@lease_owned on {name} is outside (above) @metrics.log_metrics: a forwarded "
                "event never runs the handler, so log_metrics would never run for it and its "
                "LeaseForwarded would never be flushed. Put @metrics.log_metrics above "
                f"@lease_owned, so that it wraps it: {RECOMMENDED_STACK}"
            )


def check_not_inside_idempotency(wrapper_marker: object, name: str) -> None:
    """Raise :class:`ConfigurationError` if this call of the guarded handler (the function
    whose ``__leaseguard__`` is ``wrapper_marker``) is made by Powertools' idempotency handler:
    ``@idempotent`` was put outside ``@lease_owned``."""
    if _IDEMPOTENCY_MODULE not in sys.modules:
        return  # no frame can belong to a package never imported (the usual case: free)
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return
        if str(frame.f_globals.get("__name__", "")).startswith(_IDEMPOTENCY_MODULE):
            function = frame.f_locals.get("self")
            function = getattr(function, "function", None)
            if any(getattr(f, "__leaseguard__", None) is wrapper_marker for f in _layers(function)):
                raise ConfigurationError(
                    f"@idempotent is outside @lease_owned on {name}: a forwarded event's 202"
                    " answer would be stored as its final result. Put @idempotent inside"
                    f" (nearest the function): {RECOMMENDED_STACK}"
                )
        frame = frame.f_back
