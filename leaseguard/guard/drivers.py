"""The two drivers of the flow: they run the handler whenever the flow yields a :class:`Run`.

They differ only in ``await``: Python cannot share one loop between a sync and an async caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from leaseguard.renewal import lease_scope

from .call import CallArgs
from .flow import Flow, Invocation
from .responses import Outcome, Run

_DONE = object()


def drive_sync(fn: Callable[..., Any], invocation: Invocation) -> Any:
    flow = invocation.flow()
    try:
        request = next(flow)
        while True:
            try:
                with _run_scope(invocation, request) as (args, kwargs):
                    outcome = Outcome(value=fn(*args, **kwargs))
            except Exception as exc:
                invocation.handler_errors.note(exc)
                outcome = Outcome(error=exc)
            request = flow.send(outcome)
    except StopIteration as done:
        return done.value
    finally:
        _finish(invocation, flow)


async def drive_async(fn: Callable[..., Any], invocation: Invocation) -> Any:
    """The flow's steps (backend calls, joining the renewer) run on a worker thread, so the
    event loop keeps serving other tasks while this one waits on the backend."""
    import asyncio

    flow = invocation.flow()
    try:
        request, result = await asyncio.to_thread(_step, flow, None)
        while result is _DONE:
            try:
                with _run_scope(invocation, request) as (args, kwargs):
                    outcome = Outcome(value=await fn(*args, **kwargs))
            except Exception as exc:
                invocation.handler_errors.note(exc)
                outcome = Outcome(error=exc)
            request, result = await asyncio.to_thread(_step, flow, outcome)
        return result
    finally:
        await asyncio.to_thread(_finish, invocation, flow)


@contextmanager
def _run_scope(invocation: Invocation, request: Run) -> Iterator[CallArgs]:
    """While one handler run lasts: ``current_lease()`` answers, log lines carry the lease."""
    handle = request.handle
    with (
        lease_scope(handle),
        invocation.telemetry.lease_context(handle.key, handle.owner, handle.token),
    ):
        yield invocation.call.with_event(request.event)


def _step(flow: Flow, outcome: Outcome | None) -> tuple[Any, Any]:
    """One step of the flow: ``(request, _DONE)``, or ``(None, result)`` once it returned
    (StopIteration cannot cross into an asyncio future)."""
    try:
        request = next(flow) if outcome is None else flow.send(outcome)
    except StopIteration as done:
        return None, done.value
    return request, _DONE


def _finish(invocation: Invocation, flow: Flow) -> None:
    flow.close()  # a BaseException mid-run still stops and joins the renewer
    invocation.telemetry.flush()
