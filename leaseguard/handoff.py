"""Handing the lease to the next signal in another invocation: the envelope and its carriers.

When the finishing owner cannot run the next signal inline (the Lambda deadline is too close),
the provider grants the lease to that signal *unclaimed*, and an envelope naming the grant
(``key``, ``owner``, ``token``) is sent to a new invocation, by an async ``Invoke`` of the same
function or through SQS. The receiver claims the grant with
:meth:`~leaseguard.signals.SignalQueue.claim_signal`, which succeeds once, only for the live
owner with exactly that token, and returns the payload **stored in the backend**. So:

* a forged envelope (any key, owner, token or payload) runs nothing: the claim fails, or, if it
  names a live grant exactly, the stored payload runs, not the forged one;
* a stale or replayed envelope (Lambda retries async events and may deliver twice) runs
  nothing: the grant is gone or already claimed;
* nothing is re-queued from an envelope: the backend still holds every signal it granted until
  its owner completes, and :meth:`~leaseguard.signals.SignalQueue.adopt_orphans` delivers it
  again if that owner never ran it.

The envelope carries the payload too (when it is at most :data:`MAX_ENVELOPE_PAYLOAD_BYTES`), for
logs and debugging only.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from leaseguard import aws
from leaseguard.errors import InvalidLeaseArgument, LeaseBackendError
from leaseguard.events import as_json, is_sqs_record
from leaseguard.observability import Telemetry
from leaseguard.validation import check_key, check_owner

ENVELOPE_FIELD = "leaseguard_handoff"
MAX_TOKEN = 2**63 - 1  # what every backend stores; a larger "token" is a forgery
ENVELOPE_VERSION = 1
MAX_ENVELOPE_PAYLOAD_BYTES = 64 * 1024

_log = logging.getLogger("leaseguard")


class InvalidEnvelope(InvalidLeaseArgument):
    """An event carries the handoff marker but its envelope is malformed."""


@dataclass(frozen=True)
class Envelope:
    key: str
    owner: str
    token: int
    payload: Any = None

    def to_event(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "version": ENVELOPE_VERSION,
            "key": self.key,
            "owner": self.owner,
            "token": self.token,
        }
        encoded = json.dumps(self.payload, separators=(",", ":"))
        if len(encoded.encode()) <= MAX_ENVELOPE_PAYLOAD_BYTES:
            body["payload"] = self.payload
        else:
            body["payload_omitted"] = True
        return {ENVELOPE_FIELD: body}


def parse_envelope(event: Any) -> Envelope | None:
    """The envelope in ``event`` (an async-invoke event or an SQS record whose body is one), or
    ``None`` for an ordinary event. A marked but malformed envelope raises
    :class:`InvalidEnvelope`."""
    data = as_json(event)
    if is_sqs_record(event) and isinstance(data, dict):
        try:
            data = json.loads(data["body"])
        except (TypeError, ValueError):
            return None
    if not isinstance(data, dict) or ENVELOPE_FIELD not in data:
        return None
    body = data[ENVELOPE_FIELD]
    if not isinstance(body, dict):
        raise InvalidEnvelope("handoff envelope must be an object")
    if body.get("version") != ENVELOPE_VERSION:
        raise InvalidEnvelope(f"unsupported handoff envelope version {body.get('version')!r}")
    token = body.get("token")
    if isinstance(token, bool) or not isinstance(token, int) or not 0 < token <= MAX_TOKEN:
        raise InvalidEnvelope(f"handoff envelope token must be an int in 1..{MAX_TOKEN}")
    try:
        key = check_key(body.get("key"))
        owner = check_owner(body.get("owner"))
    except InvalidLeaseArgument as exc:
        raise InvalidEnvelope(f"handoff envelope: {exc}") from exc
    return Envelope(key=key, owner=owner, token=token, payload=body.get("payload"))


class Dispatcher(Protocol):
    """Sends an envelope to the invocation that will claim it."""

    def dispatch(self, envelope: Envelope) -> None: ...


@runtime_checkable
class DelayedDispatcher(Protocol):
    """A dispatcher that can also send an envelope to arrive after a delay (a retry's wait,
    :mod:`leaseguard.guard.retries`), when ``can_delay`` says so."""

    @property
    def can_delay(self) -> bool: ...

    def dispatch(self, envelope: Envelope) -> None: ...

    def dispatch_later(self, envelope: Envelope, delay_ms: int) -> None: ...


class InvokeDispatcher:
    """Async ``Invoke`` (``InvocationType="Event"``) of a Lambda function, normally the
    current one (``context.invoked_function_arn``)."""

    def __init__(self, function_name: str, client: Any = None) -> None:
        self.function_name = function_name
        self.client = client if client is not None else aws.default_client("lambda")

    def dispatch(self, envelope: Envelope) -> None:
        try:
            self.client.invoke(
                FunctionName=self.function_name,
                InvocationType="Event",
                Payload=json.dumps(envelope.to_event()).encode(),
            )
        except Exception as exc:
            raise LeaseBackendError(f"async invoke of {self.function_name} failed: {exc}") from exc


class SqsDispatcher:
    """``SendMessage`` to an SQS queue that triggers the guarded function. On a FIFO queue the
    key is the message group, so handoffs for one key stay ordered."""

    def __init__(self, queue_url: str, client: Any = None) -> None:
        self.queue_url = queue_url
        self.client = client if client is not None else aws.default_client("sqs")

    @property
    def can_delay(self) -> bool:
        """A standard queue delays each message; a FIFO queue only as a whole (its setting)."""
        return not self.queue_url.endswith(".fifo")

    def dispatch(self, envelope: Envelope) -> None:
        self._send(envelope, {})

    def dispatch_later(self, envelope: Envelope, delay_ms: int) -> None:
        """Send ``envelope`` to arrive after ``delay_ms`` (rounded up to whole seconds, at most
        the 900 SQS allows); on a FIFO queue it is sent at once."""
        if not self.can_delay:
            self.dispatch(envelope)
            return
        self._send(envelope, {"DelaySeconds": min(900, -(-delay_ms // 1000))})

    def _send(self, envelope: Envelope, extra: dict[str, Any]) -> None:
        params: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MessageBody": json.dumps(envelope.to_event()),
            **extra,
        }
        if self.queue_url.endswith(".fifo"):
            # Group ids allow 128 characters and keys 1 KiB; a digest keeps both unique per key.
            import hashlib  # here, not at import: OpenSSL's load is a cold-start cost

            digest = hashlib.sha256(envelope.key.encode()).hexdigest()
            params["MessageGroupId"] = digest
            params["MessageDeduplicationId"] = f"{digest[:40]}-{envelope.token}"
        try:
            self.client.send_message(**params)
        except Exception as exc:
            raise LeaseBackendError(f"SQS send to {self.queue_url} failed: {exc}") from exc


def dispatch_orphans(
    provider: Any, dispatcher: Dispatcher, ttl_ms: int, limit: int = 100, *, metrics: Any = None
) -> list[Envelope]:
    """One sweeper pass: adopt keys whose owner died with signals pending and send each adopted
    signal to an invocation that will claim it. A failed send is logged and skipped: the grant
    expires unclaimed and the next pass adopts it again.

    Each adopted key counts ``OrphanAdopted`` and records ``OldestQueuedAgeMs`` (how long its
    adopted head has waited since it was queued), to ``metrics`` (a Powertools ``Metrics``) or,
    as ``@lease_owned`` does, to metrics of its own flushed after the pass when
    ``POWERTOOLS_METRICS_NAMESPACE`` is set. A key that stays stuck (its grants never claimed)
    is adopted again by every pass once its grant expires, each time older: the age is what an
    alarm watches."""
    telemetry = Telemetry(logger=_log, metrics=metrics)
    sent: list[Envelope] = []
    adopted = provider.adopt_orphans(ttl_ms, limit, claim=False)
    for key, signal in adopted:
        telemetry.count("OrphanAdopted")
        telemetry.queued_age(signal)
        envelope = Envelope(key, signal.id, signal.token or 0, signal.payload)
        try:
            dispatcher.dispatch(envelope)
        except LeaseBackendError:
            _log.exception("could not dispatch adopted signal %s of key %r", signal.id, key)
            continue
        sent.append(envelope)
    if adopted:  # an empty flush would only warn "No application metrics to publish"
        telemetry.flush()
    return sent
