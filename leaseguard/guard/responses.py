"""What a guarded invocation returns when its handler's own result is not the answer.

API Gateway needs a proxy response (``statusCode``, ``headers``, ``body``): a raw dict makes a
REST API answer 502. Every other source gets the ``{"leaseguard": {...}}`` body itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from leaseguard.errors import PayloadTooLarge, QueueFull
from leaseguard.events import forwarded_response, is_api_gateway

if TYPE_CHECKING:
    from leaseguard.renewal import LeaseHandle


class Status(StrEnum):
    """The ``status`` of a ``{"leaseguard": {...}}`` answer: one stable word each, the table in
    docs/design.md ("Statuses"). A member equals its string (``Status.FORWARDED ==
    "forwarded"``); answers carry the plain string."""

    FORWARDED = "forwarded"
    """Queued behind the key's owner, at ``position``; it runs later (HTTP 202)."""
    QUEUED = "queued"
    """This invocation ran a dead owner's work first and stopped before its own event, which
    stays queued and runs later (HTTP 202)."""
    DUPLICATE = "duplicate"
    """A redelivery of an event that is running or already ran: not run again (HTTP 202)."""
    DEAD_LETTERED = "dead_lettered"
    """The event is one of the key's dead letters (its ``max_attempts`` runs failed): a retry of
    it, or the hand-off run that failed its last attempt. Not run again unless redriven."""
    RETRIED = "retried"
    """A hand-off run of a queued event failed: it goes back to the head of the key's queue."""
    HALTED = "halted"
    """A hand-off run failed its last attempt and the key's dead-letter list was full: kept at
    the head of the queue, the key halted until a redrive."""
    QUEUE_FULL = "queue_full"
    """Refused: the key's queue is at ``max_queue`` (or its storage is full). HTTP 429 for API
    Gateway; other sources get :class:`~leaseguard.errors.QueueFull` raised."""
    TOO_LARGE = "too_large"
    """Refused: the event is over the payload limit. HTTP 413 for API Gateway; other sources
    get :class:`~leaseguard.errors.PayloadTooLarge` raised."""
    REJECTED = "rejected"
    """A hand-off envelope that is malformed, stale, replayed or forged: nothing ran."""


@dataclass(frozen=True)
class Run:
    """The flow asks its driver to run the handler on ``event`` while ``handle`` is held."""

    event: Any
    handle: LeaseHandle


@dataclass(frozen=True)
class Outcome:
    """How one handler run ended: its return value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None


def forwarded(
    event: Any,
    key: str,
    signal_id: str,
    holder: str | None,
    position: int | None,
    status: Status = Status.FORWARDED,
) -> Any:
    """The event waits in the key's queue (or was not queued again: :attr:`Status.DUPLICATE`,
    :attr:`Status.DEAD_LETTERED`)."""
    body = {
        "leaseguard": {
            "status": status.value,
            "key": key,
            "signal_id": signal_id,
            "holder": holder,
            "position": position,
        }
    }
    return forwarded_response(event, body)  # API Gateway: 202 Accepted


def rejected(reason: str, key: str | None = None) -> dict[str, Any]:
    """A hand-off envelope that cannot be claimed. Only Lambda's async Invoke and SQS deliver
    envelopes, so this is never an API Gateway response."""
    body: dict[str, Any] = {"status": Status.REJECTED.value, "reason": reason}
    if key is not None:
        body["key"] = key
    return {"leaseguard": body}


def queue_full(event: Any, full: QueueFull) -> Any:
    """HTTP 429 for API Gateway; any other source gets the error (a batch record handler's
    record then becomes a batch item failure and comes back later)."""
    if not is_api_gateway(event):
        raise full
    answer: dict[str, Any] = {
        "status": Status.QUEUE_FULL.value,
        "key": full.key,
        "depth": full.depth,
        "max_queue": full.limit,
    }
    if full.why:  # full below max_queue (DynamoDB: the lease item's size)
        answer["reason"] = full.why
    return http(429, {"leaseguard": answer}, {"retry-after": "1"})


def too_large(event: Any, large: PayloadTooLarge) -> Any:
    """HTTP 413 for API Gateway; any other source gets the error."""
    if not is_api_gateway(event):
        raise large
    answer = {"status": Status.TOO_LARGE.value, "reason": str(large)}
    return http(413, {"leaseguard": answer})


def chain_result(
    event: Any,
    key: str,
    primary: str,
    outcome: Outcome | None,
    *,
    own_event: bool,
    fate: Status = Status.RETRIED,
) -> Any:
    """The invocation's answer once its chain of runs ended. ``outcome`` is the run of
    ``primary`` (the invocation's own event, or the signal it was sent to run), ``None`` when the
    chain stopped before reaching it. A failed own event re-raises, so the platform retries it;
    a failed queued signal is the backend's to retry or dead-letter (``fate``: what the
    hand-off's report did with it), and re-raising would only make Lambda resend a spent
    envelope."""
    if outcome is None:
        # An adopted chain that stopped before this invocation's own event: that event stays
        # queued and runs later, like any forwarded one.
        return forwarded(event, key, primary, None, None, status=Status.QUEUED)
    if outcome.error is None:
        return outcome.value
    if own_event:
        raise outcome.error
    return forwarded(event, key, primary, None, None, status=fate)


def http(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return {
        "statusCode": status,
        "headers": {"content-type": "application/json", **(headers or {})},
        "body": json.dumps(body),
    }
