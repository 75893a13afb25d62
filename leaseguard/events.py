"""Lambda event shapes the guard needs to recognise: API Gateway requests (which get a 202 when
forwarded), SQS records (whose message id identifies the signal), and typed event wrappers
(Powertools data classes, pydantic models) that must be stored as JSON and rebuilt."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def as_json(event: Any) -> Any:
    """The JSON value stored for an event: the raw dict behind a Powertools data class, a
    pydantic model's JSON form, or the event itself."""
    if type(event) is dict:  # the usual event: no wrapper to look into (a forward asks 5 times)
        return event
    raw = getattr(event, "raw_event", None)
    if isinstance(raw, Mapping):
        return dict(raw)
    dump = getattr(event, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return event


def rebuild_like(template: Any, payload: Any) -> Any:
    """``payload`` (JSON) turned into the same kind of object as ``template``, so a signal run
    inline receives what the handler's own event looked like."""
    kind = type(template)
    if isinstance(getattr(template, "raw_event", None), Mapping) and isinstance(payload, dict):
        return kind(payload)
    validate = getattr(kind, "model_validate", None)
    if callable(validate) and isinstance(payload, dict):
        return validate(payload)
    return payload


def _mapping(event: Any) -> Mapping[str, Any] | None:
    if type(event) is dict:
        return event
    data = as_json(event)
    return data if isinstance(data, Mapping) else None


def is_api_gateway(event: Any) -> bool:
    """REST API (v1 proxy) or HTTP API (v2) request events; Lambda function URLs (the v2 shape)
    and ALB target events (the v1 shape) too: each answers with the same proxy response."""
    data = _mapping(event)
    if data is None or not isinstance(data.get("requestContext"), Mapping):
        return False
    return "httpMethod" in data or data.get("version") == "2.0" or "routeKey" in data


def caller_waits(event: Any) -> bool:
    """Whether the event's source holds its caller until the invocation returns: API Gateway
    (REST and HTTP APIs), function URLs and ALB. SQS, async invokes, streams and hand-off
    envelopes do not; a synchronous ``Invoke`` (``RequestResponse``) does, but its event and
    context look like an async one's, so only the ``caller_waits=`` setting can say so."""
    return is_api_gateway(event)


def is_sqs_record(event: Any) -> bool:
    data = _mapping(event)
    return data is not None and data.get("eventSource") == "aws:sqs" and "body" in data


def signal_id(event: Any, context: Any) -> str:
    """The id a forwarded event is queued under: retries of the same delivery must map to the
    same id so they are queued once. SQS records share one request id per batch, so they use
    their message id; everything else uses the Lambda request id."""
    data = _mapping(event)
    if data is not None:
        for field in ("messageId", "eventID"):
            value = data.get(field)
            if isinstance(value, str) and value:
                return value
    request_id = getattr(context, "aws_request_id", None)
    if isinstance(request_id, str) and request_id:
        return request_id
    import uuid  # here, not at import (it loads platform): only a call without a context

    return f"local-{uuid.uuid4()}"


def forwarded_response(event: Any, body: dict[str, Any]) -> Any:
    """What a forwarded invocation returns: API Gateway gets HTTP 202 Accepted, anything else
    the body itself."""
    if is_api_gateway(event):
        return {
            "statusCode": 202,
            "headers": {"content-type": "application/json"},
            "body": json.dumps(body),
        }
    return body
