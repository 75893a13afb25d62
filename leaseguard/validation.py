"""Argument checks shared by every provider, run before any I/O.

A provider that validates in its own way would accept different inputs on different backends,
so every public provider method goes through these functions first (see
:class:`leaseguard.providers.base.BaseLeaseProvider`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import InvalidLeaseArgument, PayloadTooLarge

MAX_KEY_BYTES = 1024
MAX_OWNER_BYTES = 1024
MAX_TTL_MS = 86_400_000  # one day: a lease longer than that is a configuration mistake
MAX_LIMIT = 10_000
DEFAULT_MAX_PAYLOAD_BYTES = 6 * 1024 * 1024
"""Lambda's limit for a synchronous invocation's event: any event Lambda can deliver fits."""
MAX_PAYLOAD_DEPTH = 64


def _check_name(what: str, value: object, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise InvalidLeaseArgument(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidLeaseArgument(f"{what} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidLeaseArgument(f"{what} is not valid unicode (lone surrogate?)") from exc
    if size > max_bytes:
        raise InvalidLeaseArgument(f"{what} is {size} bytes of UTF-8; the limit is {max_bytes}")
    return value


def check_key(key: object) -> str:
    """A key is a non-empty ``str`` of at most 1 KiB of UTF-8. Any characters are allowed:
    providers escape what their storage treats specially."""
    return _check_name("key", key, MAX_KEY_BYTES)


def check_owner(owner: object, what: str = "owner") -> str:
    """An owner (or signal id) is a non-empty ``str`` of at most 1 KiB of UTF-8."""
    return _check_name(what, owner, MAX_OWNER_BYTES)


def check_positive_int(what: str, value: object, maximum: int) -> int:
    # bool is an int subclass; True as a TTL is always a bug.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isnan(value):
            raise InvalidLeaseArgument(f"{what} must be an int, got NaN")
        raise InvalidLeaseArgument(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise InvalidLeaseArgument(f"{what} must be positive, got {value}")
    if value > maximum:
        raise InvalidLeaseArgument(f"{what} must be at most {maximum}, got {value}")
    return value


def check_ttl(ttl_ms: object) -> int:
    """``ttl_ms`` is an ``int`` (not a bool or float) in 1..86,400,000."""
    return check_positive_int("ttl_ms", ttl_ms, MAX_TTL_MS)


def check_limit(limit: object) -> int:
    return check_positive_int("limit", limit, MAX_LIMIT)


def _check_shape(value: Any, depth: int) -> None:
    # json.dumps would recurse until RecursionError on hostile nesting; stop much earlier with a
    # message that says what is wrong. Non-str dict keys are refused because json.dumps would
    # silently turn them into strings and the handler would get a different payload back.
    if depth > MAX_PAYLOAD_DEPTH:
        raise InvalidLeaseArgument(f"payload is nested deeper than {MAX_PAYLOAD_DEPTH} levels")
    if isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                raise InvalidLeaseArgument(
                    f"payload object keys must be str, got {type(name).__name__} {name!r}"
                )
            _check_shape(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_shape(item, depth + 1)


def encode_payload(payload: object, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode a signal payload as compact JSON, or raise :class:`InvalidLeaseArgument`.

    Only JSON values are accepted (dict with str keys, list, str, int, float, bool, None);
    NaN and infinities are refused because other JSON readers reject them. Payloads are stored
    as this text and never pickled.
    """
    _check_shape(payload, 0)
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidLeaseArgument(f"payload is not JSON-serializable: {exc}") from exc
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate ("\ud800") is legal JSON but not UTF-8: keep it as a \u escape,
        # which every backend stores and json.loads gives back unchanged.
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
        size = len(text)
    if size > max_bytes:
        raise PayloadTooLarge(size, max_bytes)
    return text
