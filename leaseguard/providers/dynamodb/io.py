"""Requests to the table: error mapping, conditional updates, batched payload reads and writes.

Every request goes through :meth:`Table.call`: a refused condition becomes
:class:`ConditionFailed` (with the ``ALL_OLD`` image), anything else botocore could not retry
away becomes :class:`~leaseguard.errors.LeaseBackendError`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from leaseguard import aws
from leaseguard.errors import LeaseBackendError, TableNotFound, extra_required
from leaseguard.protocol.state import DEAD_LIMIT
from leaseguard.providers.base import new_nonce
from leaseguard.signals import decode_signal
from leaseguard.types import Signal

from .expressions import PAYLOAD_EXISTS, PAYLOAD_TTL_UPDATE
from .schema import (
    LEASE_SK,
    NAMES,
    OPTIMISTIC_ATTEMPTS,
    SIGNAL_SK_PREFIX,
    SPLIT,
    Lease,
    attribute_value,
    inline_record,
    is_inline,
    item_sks,
    split_record,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

_log = logging.getLogger("leaseguard")

_BATCH_GET = 100
_BATCH_WRITE = 25
_BATCH_WRITE_BYTES = 12 * 1024 * 1024  # of a request's items as sent (DynamoDB allows 16 MB)
_NAME_RE = re.compile(r"#\w+")
_VALUE_RE = re.compile(r":\w+")


class ConditionFailed(Exception):
    """A conditional write was refused; ``lease`` is the item as DynamoDB saw it (ALL_OLD)."""

    def __init__(self, item: Mapping[str, Any] | None) -> None:
        super().__init__("conditional check failed")
        self.lease = Lease.parse(item)


class Retry:
    """Returned by a step whose optimistic write lost to another writer: try again from
    ``lease`` (the ALL_OLD image of the refusal, a consistent snapshot), or read when None."""

    def __init__(self, lease: Lease | None = None) -> None:
        self.lease = lease


class Table:
    """One table as the steps use it: the client, the caller's clock and the item lifetimes."""

    def __init__(
        self,
        name: str,
        client: DynamoDBClient,
        clock: Callable[[], int],
        clock_skew_ms: int,
        retention_s: int,
        orphan_shards: int,
        dead_limit: int = DEAD_LIMIT,
    ) -> None:
        with extra_required("dynamodb", "the DynamoDB provider"):
            from botocore.exceptions import BotoCoreError, ClientError

        self.name = name
        self.client = client
        self.clock = clock
        self.clock_skew_ms = clock_skew_ms
        self.retention_s = retention_s
        self.orphan_shards = orphan_shards
        self.dead_limit = dead_limit  # dead letters a lease item lists at most [G6]
        self.client_error = ClientError
        self.botocore_error = BotoCoreError

    # -- time, lifetimes and index shards -------------------------------------------------------

    def times(self) -> tuple[int, int]:
        """The caller's clock and the takeover cutoff ``now - clock_skew_ms``."""
        now = int(self.clock())
        return now, now - self.clock_skew_ms

    def ttl(self, until_ms: int) -> int:
        return until_ms // 1000 + self.retention_s

    def shard(self, key: str) -> str:
        """``gp``: the key's partition of the ``orphans`` index."""
        return f"orph#{zlib.crc32(key.encode('utf-8')) % self.orphan_shards}"

    def dead_shard(self, key: str) -> str:
        """``gd``: the key's partition of the ``dead_letters`` index (as ``orph#`` for orphans)."""
        return f"dead#{zlib.crc32(key.encode('utf-8')) % self.orphan_shards}"

    # -- requests -------------------------------------------------------------------------------

    def call(self, what: str, method: Callable[..., Any], params: dict[str, Any]) -> Any:
        try:
            return method(**params)
        except self.client_error as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                raise ConditionFailed(exc.response.get("Item")) from None  # type: ignore[arg-type]
            if error_code(exc) == "ResourceNotFoundException":
                raise TableNotFound(self.name, aws.location(self.client)) from exc
            raise LeaseBackendError(f"DynamoDB {what} failed: {exc}") from exc
        except self.botocore_error as exc:
            raise LeaseBackendError(f"DynamoDB {what} failed: {exc}") from exc

    def update(
        self,
        key: str,
        update: str,
        condition: str | None,
        values: Mapping[str, object],
        *,
        returns: str = "NONE",
        sk: str = LEASE_SK,
    ) -> dict[str, Any]:
        """One conditional UpdateItem on ``key``'s lease item. Raises :class:`ConditionFailed`
        with the ALL_OLD image when the condition is false."""
        text = f"{update} {condition or ''}"
        params: dict[str, Any] = {
            "TableName": self.name,
            "Key": {"pk": {"S": key}, "sk": {"S": sk}},
            "UpdateExpression": update,
            "ExpressionAttributeNames": {n: NAMES[n] for n in set(_NAME_RE.findall(text))},
            "ReturnValues": returns,
        }
        used = set(_VALUE_RE.findall(text))
        if used:
            params["ExpressionAttributeValues"] = {
                name: attribute_value(value) for name, value in values.items() if name in used
            }
        if condition:
            params["ConditionExpression"] = condition
            params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        response = self.call("UpdateItem", self.client.update_item, params)
        return dict(response.get("Attributes") or {})

    def read(self, key: str) -> Lease:
        response = self.call(
            "GetItem",
            self.client.get_item,
            {
                "TableName": self.name,
                "Key": {"pk": {"S": key}, "sk": {"S": LEASE_SK}},
                "ConsistentRead": True,
            },
        )
        return Lease.parse(response.get("Item"))

    def index_keys(
        self, index: str, condition: str, shard: str, cutoff: int | None = None
    ) -> Iterator[str]:
        """The keys (``pk``) in one shard of a sparse index (``orphans`` or ``dead_letters``),
        page by page: the only Query this provider makes, and never a Scan."""
        names = {n: NAMES[n] for n in set(_NAME_RE.findall(condition))}
        values: dict[str, Any] = {":g": {"S": shard}}
        if cutoff is not None:
            values[":cutoff"] = {"N": str(cutoff)}
        params: dict[str, Any] = {
            "TableName": self.name,
            "IndexName": index,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        while True:
            page = self.call("Query", self.client.query, params)
            for item in page.get("Items", []):
                yield str(item["pk"]["S"])
            start = page.get("LastEvaluatedKey")
            if not start:
                return
            params["ExclusiveStartKey"] = start

    # -- payload items --------------------------------------------------------------------------

    def payloads(self, key: str, refs: Sequence[str]) -> dict[str, str]:
        """Stored signal records by ref (consistent reads); refs whose item is gone (TTL) are
        missing from the result."""
        return {ref: str(item["r"]["S"]) for ref, item in self.payload_items(key, refs).items()}

    def payload_items(
        self, key: str, refs: Sequence[str], extra: Sequence[str] = ()
    ) -> dict[str, dict[str, Any]]:
        """Payload items by ref (``r`` and the ``extra`` attributes), consistent reads. A split
        payload's pieces are read in the same requests and joined into ``r``; one whose head or
        any piece is gone (TTL) is missing from the result, as a payload item that is gone.
        An inline ref is its own record: no request, and never gone."""
        found = {ref: {"r": {"S": inline_record(ref)}} for ref in refs if is_inline(ref)}
        unique = [ref for ref in dict.fromkeys(refs) if ref not in found]
        got = self._get_items(
            key, [sk for ref in unique for sk in item_sks(ref)], ["sk", "r", *extra]
        )
        for ref in unique:
            parts = [got.get(sk) for sk in item_sks(ref)]
            if any(part is None or "r" not in part for part in parts):
                continue
            item = dict(parts[0] or {})
            if len(parts) > 1:
                item["r"] = {"S": "".join(str(part["r"]["S"]) for part in parts if part)}
            found[ref] = item
        return found

    def _get_items(self, key: str, sks: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
        """Items of ``key`` by sort key (BatchGetItem: 100 keys a request; what a response
        leaves out, over its 16 MB or throttled, is asked for again). Absent items are
        missing from the result."""
        found: dict[str, Any] = {}
        for start in range(0, len(sks), _BATCH_GET):
            keys = [{"pk": {"S": key}, "sk": {"S": sk}} for sk in sks[start : start + _BATCH_GET]]
            for _ in range(OPTIMISTIC_ATTEMPTS):
                response = self.call(
                    "BatchGetItem",
                    self.client.batch_get_item,
                    {
                        "RequestItems": {
                            self.name: {
                                "Keys": keys,
                                "ConsistentRead": True,
                                "ProjectionExpression": ", ".join(f"#{n}" for n in names),
                                "ExpressionAttributeNames": {f"#{n}": n for n in names},
                            }
                        }
                    },
                )
                items = response.get("Responses", {}).get(self.name, [])
                for item in items:
                    found[str(item["sk"]["S"])] = dict(item)
                keys = response.get("UnprocessedKeys", {}).get(self.name, {}).get("Keys")
                if not keys:
                    break
                if not items:  # throttled (a response over 16 MB still made progress)
                    time.sleep(random.uniform(0.005, 0.05))
            else:
                raise LeaseBackendError(f"DynamoDB kept throttling payload reads of {key!r}")
        return found

    def stored_signal(
        self, key: str, lease: Lease, signal_id: str, token: int | None
    ) -> Signal | None:
        """A stored signal of the snapshot, decoded with its attempts (None: payload gone)."""
        ref = lease.ref_of(signal_id)
        stored = self.payloads(key, [ref]).get(ref) if ref is not None else None
        attempts = lease.attempts.get(signal_id, 0)
        return None if stored is None else decode_signal(signal_id, stored, token, attempts)

    def first_payload(self, key: str, refs: Sequence[str]) -> tuple[int, str | None]:
        """Index and record of the first ref whose payload still exists (normally the first
        one; payload items only vanish through their TTL, inline records never)."""
        if not refs:
            return 0, None
        found = self.payloads(key, refs[:1])
        if refs[0] in found:
            return 0, found[refs[0]]
        for start in range(1, len(refs), _BATCH_GET):
            # past a payload that is gone: find which heads are left (keys only, not the
            # records, which may be megabytes each), then read those whole in order
            chunk = refs[start : start + _BATCH_GET]
            items = [SIGNAL_SK_PREFIX + ref for ref in chunk[: _first_inline(chunk)]]
            heads = self._get_items(key, items, ["sk"])
            for offset, ref in enumerate(chunk):
                if is_inline(ref):
                    return start + offset, inline_record(ref)
                if SIGNAL_SK_PREFIX + ref in heads:
                    stored = self.payloads(key, [ref]).get(ref)
                    if stored is not None:
                        return start + offset, stored
        return 0, None

    def put_signal(
        self,
        key: str,
        signal_id: str,
        record: str,
        now: int,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Store a signal record before any lease write references it; returns its ref. A
        record that fits one item is one PutItem (with the ``extra`` attributes); a larger one
        is split into pieces, one item each, written with BatchWriteItem (the ref then ends in
        ``.<number of items>``). A resend rewrites identical items; pieces of a call that
        failed are reaped by their TTL, as nothing references them."""
        ref = new_nonce()
        ttl = {"N": str(now // 1000 + self.retention_s)}
        pieces = split_record(record)

        def item(sk: str, piece: str) -> dict[str, Any]:
            keys = {"pk": {"S": key}, "sk": {"S": sk}}
            return {**keys, "i": {"S": signal_id}, "r": {"S": piece}, "ttl": ttl}

        if len(pieces) == 1:
            head = {**item(SIGNAL_SK_PREFIX + ref, record), **(extra or {})}
            self.call("PutItem", self.client.put_item, {"TableName": self.name, "Item": head})
            return ref
        ref = f"{ref}{SPLIT}{len(pieces)}"
        puts = [
            {"PutRequest": {"Item": item(sk, piece)}}
            for sk, piece in zip(item_sks(ref), pieces, strict=True)
        ]
        # A BatchWriteItem request is at most 16 MB as sent: JSON with \u escapes, up to three
        # times a piece's UTF-8 size (2-byte characters), so requests are also cut by that size.
        sizes = [len(json.dumps(put)) for put in puts]
        if not self._write_items(puts, sizes):
            raise LeaseBackendError(f"DynamoDB kept throttling payload writes of {key!r}")
        return ref

    def _write_items(
        self, requests: Sequence[Mapping[str, Any]], sizes: Sequence[int] | None = None
    ) -> bool:
        """BatchWriteItem, 25 requests (and, with their ``sizes`` as sent, _BATCH_WRITE_BYTES)
        at a time, unprocessed ones sent again (a few times, with a pause). False when some
        stayed unprocessed; request errors raise."""
        batches: list[list[Mapping[str, Any]]] = []
        total = 0
        for n, request in enumerate(requests):
            size = sizes[n] if sizes is not None else 0
            if not batches or len(batches[-1]) >= _BATCH_WRITE or total + size > _BATCH_WRITE_BYTES:
                batches.append([])
                total = 0
            batches[-1].append(request)
            total += size
        done = True
        for batch in batches:
            pending: Any = batch
            for attempt in range(8):
                if attempt:
                    time.sleep(random.uniform(0.005, 0.05) * attempt)
                response = self.call(
                    "BatchWriteItem",
                    self.client.batch_write_item,
                    {"RequestItems": {self.name: pending}},
                )
                pending = response.get("UnprocessedItems", {}).get(self.name)
                if not pending:
                    break
            else:
                done = False
        return done

    def delete_signals(self, key: str, refs: Sequence[str]) -> None:
        """Remove payload items (a split payload's pieces too) that nothing references any
        more. A failure is logged, not raised: the step that completed them has already been
        applied, so failing it would make its caller retry work that is done, and the items
        carry a TTL (``retention_s``) that reaps them anyway."""
        requests = [
            {"DeleteRequest": {"Key": {"pk": {"S": key}, "sk": {"S": sk}}}}
            for ref in dict.fromkeys(refs)
            if not is_inline(ref)  # left with the lease write that removed its ref
            for sk in item_sks(ref)
        ]
        try:
            if not self._write_items(requests):
                _log.warning(
                    "payload items of %r left to their TTL: their deletes kept being throttled",
                    key,
                )
        except LeaseBackendError as exc:
            _log.warning("payload items of %r left to their TTL: %s", key, exc)

    def renew_payloads(self, key: str, refs: Sequence[str], now: int, *, pieces: bool) -> None:
        """Move the TTL of stored payload items to ``retention_s`` from ``now`` (only the pieces
        of a split payload, after its head, with ``pieces``). One conditional UpdateItem per
        item: one already gone (TTL) stays gone."""
        for ref in dict.fromkeys(ref for ref in refs if not is_inline(ref)):
            for sk in item_sks(ref)[1 if pieces else 0 :]:
                with contextlib.suppress(ConditionFailed):
                    self.update(
                        key, PAYLOAD_TTL_UPDATE, PAYLOAD_EXISTS, {":ttl": self.ttl(now)}, sk=sk
                    )


def _first_inline(refs: Sequence[str]) -> int:
    return next((i for i, ref in enumerate(refs) if is_inline(ref)), len(refs))


def error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))
