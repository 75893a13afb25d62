"""Seeded mutants of the guard that ships: edits of the source of ``leaseguard/guard/``, as a
bug would make them, which the explorer runs in place of the real modules and must catch.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SourceChange:
    """One edit of a module of the guard that ships: ``old`` (found exactly once) -> ``new``."""

    module: str
    old: str
    new: str


@contextmanager
def source_mutation(module: Any, old: str, new: str) -> Iterator[None]:
    """``module`` with ``old`` replaced by ``new`` in its source, for as long as inside: the
    mutated functions and classes replace the originals in the module and wherever they were
    imported (a seeded mutant of the code that ships, for the model checker to catch)."""
    source = inspect.getsource(module)
    if source.count(old) != 1:
        raise AssertionError(f"mutant: {old!r} is not in {module.__name__} exactly once")
    mutated = types.ModuleType(module.__name__)
    mutated.__dict__.update({"__file__": module.__file__, "__package__": module.__package__})
    exec(compile(source.replace(old, new), module.__file__, "exec"), mutated.__dict__)
    swaps: list[tuple[Any, str, Any]] = []
    for name, original in vars(module).items():
        replacement = mutated.__dict__.get(name)
        if replacement is None or replacement is original:
            continue
        if not (isinstance(original, type) or callable(original)):
            continue
        if getattr(original, "__module__", None) != module.__name__:
            continue
        for holder in [m for m in list(sys.modules.values()) if m is not None]:
            if getattr(holder, "__name__", "").startswith("leaseguard") and (
                holder.__dict__.get(name) is original
            ):
                swaps.append((holder, name, original))
    for holder, name, _original in swaps:
        setattr(holder, name, mutated.__dict__[name])
    try:
        yield
    finally:
        for holder, name, original in swaps:
            setattr(holder, name, original)


FLOW = "leaseguard.guard.flow"
DRAIN = "leaseguard.guard.drain"
RESPONSES = "leaseguard.guard.responses"
RETRIES = "leaseguard.guard.retries"

# name, the family of bounds that can see it, the edit
GUARD_MUTANTS: tuple[tuple[str, str, SourceChange], ...] = (
    (
        "guard-failed-take-charges-unseen",
        "core",
        SourceChange(
            FLOW,
            'report = {"completed": [], "failed": ran} if error else',
            "report = {} if error else",
        ),
    ),
    (
        "guard-runs-a-late-grant",
        "core",
        SourceChange(
            FLOW,
            "            if handle._settle():\n                # The grant's reply came",
            "            if False:\n                # The grant's reply came",
        ),
    ),
    (
        "guard-drain-reports-nothing",
        "drain",
        SourceChange(
            DRAIN,
            'progress: dict[str, Any] = {"token": handle.token, "completed": drained.completed}',
            'progress: dict[str, Any] = {"token": handle.token}',
        ),
    ),
    (
        "guard-ttl-clock-from-reply",
        "core",
        SourceChange(FLOW, "                sent_at=sent_at,\n", "                sent_at=None,\n"),
    ),
    (
        "guard-failed-run-reported-ok",
        "core",
        SourceChange(
            FLOW,
            "            if error is not None:\n                report |=",
            "            if False:\n                report |=",
        ),
    ),
    (
        "guard-failed-take-completes",
        "core",
        SourceChange(FLOW, "unseen = handle.take_failed\n", "unseen = False\n"),
    ),
    (
        "guard-own-failure-swallowed",
        "core",
        SourceChange(
            RESPONSES,
            "    if own_event:\n        raise outcome.error\n",
            "    if False:\n        raise outcome.error\n",
        ),
    ),
    (
        "guard-batch-item-runs-as-its-owner",
        "drain",
        SourceChange(DRAIN, "ItemLease(handle, signal))", "handle)"),
    ),
    (
        "guard-retry-runs-at-once",
        "core",
        SourceChange(
            FLOW,
            "            if retry is not None and nxt.id == retry.signal_id:\n",
            "            if False:\n",
        ),
    ),
    (
        "guard-retry-delay-unjittered-low",
        "core",
        SourceChange(
            RETRIES,
            "    return max(1, int(ceiling * (0.5 + spread / 2)))\n",
            "    return max(1, int(ceiling * spread / 4))\n",
        ),
    ),
    (
        "guard-waiting-caller-drains-inline",
        "waiting",
        SourceChange(FLOW, "waiting = self.waits and answered", "waiting = False"),
    ),
    (
        "guard-full-forward-dropped",
        "queue",
        SourceChange(
            RESPONSES,
            "    if not is_api_gateway(event):\n        raise full\n",
            "    if not is_api_gateway(event):\n        return None\n",
        ),
    ),
)
