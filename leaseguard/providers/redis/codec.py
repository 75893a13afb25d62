"""Script arguments and replies: what the provider sends beside the keys, and the decoding of
what the scripts answer into :class:`~leaseguard.types.Signal` and
:class:`~leaseguard.types.DeadLetter`."""

from __future__ import annotations

import json
from typing import Any

from leaseguard.signals import decode_signal
from leaseguard.types import DeadLetter, Signal


def as_text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def fence_arg(token: int | None) -> str:
    """The token argument of the owner-side scripts: ``''`` accepts any grant of the owner."""
    return "" if token is None else str(token)


def owning_signal(reply: list[Any]) -> Signal:
    """``[id, token, stored, attempts]`` from a script: the signal that owns the key."""
    signal_id, token, stored, attempts = reply
    return decode_signal(as_text(signal_id), stored, int(token), int(attempts))


def listed_signals(flat: list[Any]) -> list[Signal]:
    """``[id, stored, attempts, ...]`` from a script: queued or taken signals (no token)."""
    return [
        decode_signal(as_text(i), s, None, int(a))
        for i, s, a in zip(flat[::3], flat[1::3], flat[2::3], strict=True)
    ]


def dead_letters(flat: list[Any]) -> tuple[DeadLetter, ...]:
    """``[id, entry, ...]`` (HGETALL of the dead hash) in the order they were dead-lettered."""
    entries = sorted(
        ((as_text(i), json.loads(e)) for i, e in zip(flat[::2], flat[1::2], strict=True)),
        key=lambda item: int(item[1]["n"]),
    )
    letters = []
    for signal_id, entry in entries:
        signal = decode_signal(signal_id, entry["r"])
        letters.append(
            DeadLetter(
                id=signal_id,
                payload=signal.payload,
                attempts=int(entry["a"]),
                error=str(entry["e"]),
                enqueued_at_ms=signal.enqueued_at_ms,
                failed_at_ms=int(entry["at"]),
            )
        )
    return tuple(letters)
