"""Signals: events that arrived for a key while another invocation owned it.

The queue lives next to the lease and every step changes both at once, which is what rules out
the lost wakeup (a forwarder enqueueing just after the owner found the queue empty and left).
The steps are the :class:`SignalQueue` methods; every provider that ships with leaseguard
implements them.

Lifecycle of a signal on a key::

    acquire_or_enqueue ──► queued ──► transfer_to_next / adopt_orphans ──► owner (in flight)
                              │                                               │
                              └──► take_signals ──► in flight ─────────────────┤
                                                                              ▼
                               completed when its owner calls transfer_to_next or release_lease

A signal stays in the backend until the owner that received it completes. If that owner dies
first (its lease expires), :meth:`SignalQueue.adopt_orphans` puts every in-flight signal back at
the head of the queue, so delivery is at least once; without crashes it is exactly once.
"""

from __future__ import annotations

import json

from .types import (
    SIGNAL_QUEUE_METHODS,
    DeadLetter,
    JSONValue,
    KeyState,
    Signal,
    SignalQueue,
    is_signal_queue,
    now_ms,
)
from .validation import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload

__all__ = [
    "SIGNAL_QUEUE_METHODS",
    "DeadLetter",
    "JSONValue",
    "KeyState",
    "Signal",
    "SignalQueue",
    "decode_signal",
    "encode_signal",
    "is_signal_queue",
    "now_ms",
]


def encode_signal(signal: Signal, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """The stored form: ``{"at": <ms>, "p": <payload>}``. Payload size is checked on the payload
    alone so the limit a user configures is the limit their events meet."""
    body = encode_payload(signal.payload, max_payload_bytes)
    return f'{{"at":{int(signal.enqueued_at_ms)},"p":{body}}}'


def decode_signal(
    signal_id: str, stored: str | bytes, token: int | None = None, attempts: int = 0
) -> Signal:
    record = json.loads(stored)
    return Signal(
        id=signal_id,
        payload=record["p"],
        enqueued_at_ms=record["at"],
        token=token,
        attempts=attempts,
    )
