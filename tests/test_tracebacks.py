"""An exception from a guarded handler reaches its caller with the handler's frames right after
the caller's and the decorator's own wrapper (the one frame Python cannot drop: every frame an
exception leaves is recorded), not the driver's, the flow's and its answer's; the exception
object, type, cause and context are unchanged. Errors leaseguard raises itself keep their
frames."""

from __future__ import annotations

import asyncio
import traceback
from pathlib import Path
from typing import Any

import pytest

import leaseguard
from leaseguard import InMemoryLeaseProvider, lease_owned
from leaseguard.errors import HandlerKeyError
from leaseguard.testing import LambdaContext

GUARD = str(Path(leaseguard.__file__).parent / "guard")


class Failure(Exception):
    pass


def parse(event: dict[str, Any]) -> int:
    try:
        return int(event["n"])
    except ValueError as exc:
        raise Failure(f"bad n {event['n']!r}") from exc


def guard_frames(frames: traceback.StackSummary) -> list[str]:
    return [f"{Path(f.filename).name}:{f.name}" for f in frames if f.filename.startswith(GUARD)]


def raised_from(call: Any) -> tuple[BaseException, traceback.StackSummary]:
    with pytest.raises(Failure) as caught:
        call()
    return caught.value, traceback.extract_tb(caught.value.__traceback__)


def test_a_handlers_error_shows_the_caller_then_the_handler() -> None:
    @lease_owned("k", provider=InMemoryLeaseProvider())
    def handler(event: dict[str, Any], context: Any) -> int:
        return parse(event)

    error, frames = raised_from(lambda: handler({"k": "a", "n": "x"}, LambdaContext()))
    names = [f.name for f in frames]
    # pytest.raises' call, the lambda (the caller), the wrapper, then the handler's own frames
    assert names[-4:] == ["<lambda>", "wrapper", "handler", "parse"], names
    assert guard_frames(frames) == ["decorator.py:wrapper"]  # the driver, flow, answer: gone
    assert type(error) is Failure and isinstance(error.__cause__, ValueError)
    assert error.__suppress_context__ and error.__context__ is error.__cause__


def test_an_async_handlers_error_is_trimmed_the_same_way() -> None:
    @lease_owned("k", provider=InMemoryLeaseProvider())
    async def handler(event: dict[str, Any], context: Any) -> int:
        await asyncio.sleep(0)
        return parse(event)

    _, frames = raised_from(lambda: asyncio.run(handler({"k": "a", "n": "x"}, LambdaContext())))
    names = [f.name for f in frames]
    assert guard_frames(frames) == ["decorator.py:async_wrapper"], names
    assert names[-3:] == ["async_wrapper", "handler", "parse"], names


def test_an_error_raised_while_handling_another_keeps_its_context() -> None:
    @lease_owned("k", provider=InMemoryLeaseProvider())
    def handler(event: dict[str, Any], context: Any) -> None:
        try:
            {}["missing"]
        except KeyError:
            raise Failure("while handling") from None

    error, _ = raised_from(lambda: handler({"k": "a"}, LambdaContext()))
    assert isinstance(error.__context__, KeyError) and error.__suppress_context__
    assert error.__cause__ is None


def test_leaseguards_own_errors_keep_their_frames() -> None:
    """A key function's failure is the guard's HandlerKeyError: its frames say where."""
    handler = lease_owned("missing.path", provider=InMemoryLeaseProvider())(lambda e, c: None)
    with pytest.raises(HandlerKeyError) as caught:
        handler({"k": "a"}, LambdaContext())
    frames = guard_frames(traceback.extract_tb(caught.value.__traceback__))
    assert len(frames) > 2 and "handler.py:search" in frames, frames
