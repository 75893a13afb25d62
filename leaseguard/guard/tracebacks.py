"""Leaseguard's frames kept out of the tracebacks of the user's own exceptions.

An exception the handler raises is caught by the driver, handed to the flow and re-raised from
it once the hand-off is done (so the platform retries the event), which puts the decorator, the
driver, the flow and its answer in front of the handler's frames: five frames of leaseguard
between the caller and the code that failed (more for ``async def`` handlers, whose flow steps
run on a worker thread). The driver notes each exception with its traceback from the handler's
own frame on (:class:`HandlerErrors`), and the decorator's wrapper re-raises it with that
traceback, as ``functools``-style wrappers should: the exception object, its type,
``__cause__`` and ``__context__`` are unchanged. The wrapper's own frame stays (Python records
every frame an exception leaves) and carries ``__tracebackhide__``, which pytest honours.
Errors leaseguard raises itself (a backend error, a lost lease, ``LeaseguardError``
subclasses) are not the handler's and keep every frame.
"""

from __future__ import annotations

from types import TracebackType


class HandlerErrors:
    """What the handler raised during one invocation, each with the traceback from the
    handler's frame down to the raise."""

    def __init__(self) -> None:
        self._raised: list[tuple[BaseException, TracebackType | None]] = []

    def note(self, error: BaseException) -> None:
        """Called where the driver catches ``error``: its traceback then starts at the driver's
        own frame, and the next entry is the handler's (none when the handler is not Python
        code, which keeps the driver's)."""
        tb = error.__traceback__
        self._raised.append((error, tb.tb_next if tb is not None and tb.tb_next else tb))

    def traceback_of(self, error: BaseException) -> TracebackType | None:
        """The handler's traceback of ``error``, or ``None`` if the handler did not raise it."""
        for raised, tb in self._raised:
            if raised is error:
                return tb
        return None
