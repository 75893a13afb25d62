"""Leases and signal queues on DynamoDB: one conditional ``UpdateItem`` per lease operation.

**Requests.** ``acquire_lease``, ``renew_lease``, ``release_lease`` and ``transfer_lease`` are
each one conditional ``UpdateItem``. A refused acquire names the holder from the same request
(``ReturnValuesOnConditionCheckFailure=ALL_OLD``); a failed condition is a normal result, never
an exception. Two documented exceptions: an acquire by the *current* owner (which must keep its
token, and a single update expression cannot both keep and raise it) sends a second, conditional
refresh after the first write's ``ALL_OLD`` showed the caller already holds the key; and a
release or transfer of a lease that carried in-flight signals deletes their payload items
afterwards (one ``BatchWriteItem`` per 25); only keys used through the signal queue have any.

**Items.** One table, key ``pk`` (S) + ``sk`` (S), all of a key's items in one partition:

* the lease item, ``pk=<key>``, ``sk="lease"``: ``o`` owner, ``e`` expiry (epoch ms, caller's
  clock), ``t`` fencing token, ``c`` claimed, ``p`` previous owner (who handed over or released
  last), ``w`` id of the last write, ``k``/``kn`` nonce and size of the owner's last take,
  ``q``/``qn`` queued signal ids and their payload refs (parallel lists, FIFO), ``f``/``fn`` the
  same for signals in flight, ``ttl`` (epoch seconds) and ``gp``/``gx`` for the orphan index;
* one payload item per queued or in-flight signal, ``sk="sig#<ref>"`` with a random ``ref``,
  holding ``i`` (signal id), ``r`` (:func:`~leaseguard.signals.encode_signal` text) and ``ttl``.
  Payloads live outside the lease item so a renewal stays one write unit; the random ref means
  deleting a completed payload can never delete a later signal that reused the same id.

**Fencing tokens** are ``SET t = if_not_exists(t, :floor) + 1`` where ``:floor`` is the
caller's clock in microseconds. A release updates the item (it never deletes it), so the token
survives release and expiry and simply counts up. The item is only deleted by DynamoDB's TTL,
``retention_s`` (default 7 days) after the lease's last expiry; a key recreated after that starts
from the caller's clock, which is then above every token issued before, provided (1) callers'
clocks are within ``retention_s`` of each other (they are within ``clock_skew_ms``, far less), and
(2) a key did not change owner more than once per microsecond of its life (every change is a
separate write to one item, which DynamoDB serialises at far less than a million per second).

**Expiry and clocks.** There is no server clock in a condition expression, so each request
carries the caller's time; TTL deletion is late (hours to days) and never relied on. The owner
side (renew, transfer, take, hand-off, release) needs ``e > now``; anyone else may take the key
only once ``e + clock_skew_ms < now`` on their clock. With callers' clocks within
``clock_skew_ms`` of each other (Lambda hosts are NTP-synced: milliseconds), a lease is never
taken over before its owner's own clock says it expired. Between the two the key is in limbo:
the owner has lost it, nobody else can have it yet, and :meth:`get_lease_owner` still names it.

**Orphans.** ``gp``/``gx`` are the key attributes of a sparse GSI (``orphans``, keys only): ``gp``
is set (to one of ``orphan_shards`` values, so no index partition runs hot) while the key may
have signals queued or in flight, and ``gx`` is the owner's deadline when it was last written
(0 after a release). :meth:`adopt_orphans` queries ``gx < now - clock_skew_ms`` in each shard and
re-checks every candidate with a consistent read and a conditional write. Renewals do not move
``gx`` (that would add an index write to every renewal); a candidate whose owner renewed is
re-indexed when the sweep meets it.

**Retries.** botocore retries throttling, 5xx, timeouts and connection errors (standard mode,
4 attempts in all by default); what still fails is :class:`~leaseguard.errors.LeaseBackendError`.
A retried write whose first attempt was applied fails its own condition; the ``ALL_OLD`` image
then shows the write's id (``w``), the take nonce (``k``) or, as on Redis, the previous owner
(``p``) of a transfer, and the call reports the applied result instead of a failure.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from leaseguard.contract import LeaseResult
from leaseguard.errors import (
    ConfigurationError,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseLostError,
)
from leaseguard.signals import KeyState, Signal, decode_signal
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES, check_positive_int

from .base import BaseLeaseProvider

if TYPE_CHECKING:
    from botocore.config import Config
    from mypy_boto3_dynamodb import DynamoDBClient

LEASE_SK = "lease"
SIGNAL_SK_PREFIX = "sig#"
ORPHAN_INDEX = "orphans"
DEFAULT_CLOCK_SKEW_MS = 1_000
DEFAULT_RETENTION_S = 7 * 86_400
DEFAULT_ORPHAN_SHARDS = 8
DEFAULT_MAX_ATTEMPTS = 4
# DynamoDB's item limit is 400 KB; the key, the signal id and the attribute names of a payload
# item take at most a few KiB of it.
DYNAMODB_MAX_PAYLOAD_BYTES = 400 * 1024 - 8 * 1024
# How often one step re-reads and retries when another writer changed the item in between.
_OPTIMISTIC_ATTEMPTS = 32
# A take moves at most this many signals per write: an UpdateExpression is limited to 4 KB.
_TAKE_BATCH = 100
_BATCH_GET = 100
_BATCH_WRITE = 25

# Every attribute name goes through ExpressionAttributeNames (``owner``, ``ttl`` and many short
# words are reserved); requests include only the names their expressions use.
_NAMES = {
    f"#{name}": name
    for name in (
        "pk",
        "sk",
        "o",
        "e",
        "t",
        "c",
        "p",
        "w",
        "k",
        "kn",
        "q",
        "qn",
        "f",
        "fn",
        "ttl",
        "gp",
        "gx",
        "i",
        "r",
    )
}
_NAME_RE = re.compile(r"#\w+")
_VALUE_RE = re.compile(r":\w+")

# Conditions shared by several requests. ``:now`` is the caller's clock, ``:cutoff`` is
# ``now - clock_skew_ms``: a lease is the owner's while ``e > now`` and anyone's once
# ``e < cutoff``.
_LIVE_OWNER = "#o = :me AND #e > :now"
_TAKEOVER = "(attribute_not_exists(#o) OR #e < :cutoff)"
_FREE_FOR_ME = "(attribute_not_exists(#o) OR #e < :cutoff OR (#o = :me AND #e <= :now))"
_NOTHING_PENDING = (
    "(attribute_not_exists(#q) OR size(#q) = :zero)"
    " AND (attribute_not_exists(#f) OR size(#f) = :zero)"
)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _nonce() -> str:
    return secrets.token_hex(8)


def _av(value: object) -> dict[str, Any]:
    """A Python value as a DynamoDB attribute value (only the shapes this module stores)."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, (list, tuple)):
        return {"L": [_av(v) for v in value]}
    raise TypeError(f"cannot store {type(value).__name__}")


def _s(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value["S"])


def _n(item: Mapping[str, Any], name: str) -> int | None:
    value = item.get(name)
    return None if value is None else int(value["N"])


def _strings(item: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = item.get(name)
    return () if value is None else tuple(str(v["S"]) for v in value["L"])


@dataclass(frozen=True)
class _Lease:
    """The lease item as read (or as returned by ``ALL_OLD``); absent attributes are empty."""

    exists: bool
    owner: str | None = None
    expiry: int = 0
    token: int | None = None
    claimed: bool = False
    previous: str | None = None
    write_id: str | None = None
    take_nonce: str | None = None
    queue: tuple[str, ...] = ()
    queue_refs: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()
    in_flight_refs: tuple[str, ...] = ()
    indexed: bool = False
    index_at: int | None = None

    @classmethod
    def parse(cls, item: Mapping[str, Any] | None) -> _Lease:
        if not item:
            return cls(exists=False)
        claimed = item.get("c")
        return cls(
            exists=True,
            owner=_s(item, "o"),
            expiry=_n(item, "e") or 0,
            token=_n(item, "t"),
            claimed=bool(claimed["BOOL"]) if claimed is not None else False,
            previous=_s(item, "p"),
            write_id=_s(item, "w"),
            take_nonce=_s(item, "k"),
            queue=_strings(item, "q"),
            queue_refs=_strings(item, "qn"),
            in_flight=_strings(item, "f"),
            in_flight_refs=_strings(item, "fn"),
            indexed="gp" in item,
            index_at=_n(item, "gx"),
        )

    def live_owner(self, owner: str, now: int) -> bool:
        """``owner`` holds the lease by its own clock (what owner-side steps require)."""
        return self.owner == owner and self.expiry > now

    def live_grant(self, owner: str, now: int, token: int | None) -> bool:
        """:meth:`live_owner`, with a token, and with exactly ``token`` when one is given."""
        return (
            self.live_owner(owner, now) and self.token is not None and token in (None, self.token)
        )

    def holder(self, cutoff: int) -> str | None:
        """Who holds the key as far as anyone else is concerned (the owner, also in limbo)."""
        if self.owner is not None and self.expiry >= cutoff:
            return self.owner
        return None

    @property
    def pending(self) -> bool:
        return bool(self.queue or self.in_flight)


class _ConditionFailed(Exception):
    """A conditional write was refused; ``lease`` is the item as DynamoDB saw it (ALL_OLD)."""

    def __init__(self, item: Mapping[str, Any] | None) -> None:
        super().__init__("conditional check failed")
        self.lease = _Lease.parse(item)


class _Retry:
    """Returned by a step whose optimistic write lost to another writer: read and try again."""


_RETRY = _Retry()


class DynamoDBLeaseProvider(BaseLeaseProvider):
    """The lease contract and signal queue on one DynamoDB table.

    ``client`` is a boto3 DynamoDB client; without one, a client is built with ``endpoint_url``,
    ``region_name`` and a botocore ``Config`` (standard retries, short timeouts) merged with
    ``retry_config``. ``clock`` returns the caller's epoch milliseconds (tests inject skewed
    clocks). Create the table with :meth:`create_table` or the schema in ``docs/dynamodb.md``.

    >>> provider = DynamoDBLeaseProvider("leaseguard")  # doctest: +SKIP
    >>> provider.acquire_lease("thread:42", "req-1", 15_000)  # doctest: +SKIP
    LeaseResult(acquired=True, owner='req-1', token=1732880000123457, ...)
    """

    atomic_transfer: ClassVar[bool] = True

    def __init__(
        self,
        table_name: str,
        client: DynamoDBClient | None = None,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        clock: Callable[[], int] | None = None,
        retry_config: Config | None = None,
        retention_s: int = DEFAULT_RETENTION_S,
        orphan_shards: int = DEFAULT_ORPHAN_SHARDS,
    ) -> None:
        super().__init__(max_payload_bytes=max_payload_bytes)
        if not isinstance(table_name, str) or not 3 <= len(table_name) <= 255:
            raise InvalidLeaseArgument("table_name must be a str of 3 to 255 characters")
        if isinstance(clock_skew_ms, bool) or not isinstance(clock_skew_ms, int):
            raise InvalidLeaseArgument("clock_skew_ms must be an int")
        if not 0 <= clock_skew_ms <= 3_600_000:
            raise InvalidLeaseArgument("clock_skew_ms must be between 0 and one hour")
        self.retention_s = check_positive_int("retention_s", retention_s, 366 * 86_400)
        if self.retention_s * 1000 < 60 * clock_skew_ms:
            # Token floors after a TTL deletion rely on retention being far above the skew.
            raise InvalidLeaseArgument("retention_s must be at least 60 times clock_skew_ms")
        self.orphan_shards = check_positive_int("orphan_shards", orphan_shards, 1000)
        self.table_name = table_name
        self.clock_skew_ms = clock_skew_ms
        self._clock = clock or _wall_ms
        self.client: DynamoDBClient = client or _build_client(
            endpoint_url, region_name, retry_config
        )
        from botocore.exceptions import BotoCoreError, ClientError

        self._client_error = ClientError
        self._botocore_error = BotoCoreError

    @classmethod
    def _payload_ceiling(cls) -> int:
        return DYNAMODB_MAX_PAYLOAD_BYTES

    # -- the table ------------------------------------------------------------------------------

    def create_table(self, *, wait: bool = True) -> None:
        """Create the table (on-demand billing, the ``orphans`` GSI) and enable TTL on ``ttl``.
        Idempotent: an existing table is checked for the index and left as it is."""
        try:
            self.client.create_table(
                TableName=self.table_name,
                BillingMode="PAY_PER_REQUEST",
                KeySchema=[
                    {"AttributeName": "pk", "KeyType": "HASH"},
                    {"AttributeName": "sk", "KeyType": "RANGE"},
                ],
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                    {"AttributeName": "gp", "AttributeType": "S"},
                    {"AttributeName": "gx", "AttributeType": "N"},
                ],
                GlobalSecondaryIndexes=[
                    {
                        "IndexName": ORPHAN_INDEX,
                        "KeySchema": [
                            {"AttributeName": "gp", "KeyType": "HASH"},
                            {"AttributeName": "gx", "KeyType": "RANGE"},
                        ],
                        "Projection": {"ProjectionType": "KEYS_ONLY"},
                    }
                ],
            )
        except self._client_error as exc:
            if _error_code(exc) != "ResourceInUseException":
                raise LeaseBackendError(f"cannot create table {self.table_name!r}: {exc}") from exc
        except self._botocore_error as exc:
            raise LeaseBackendError(f"cannot create table {self.table_name!r}: {exc}") from exc
        try:
            if wait:
                self.client.get_waiter("table_exists").wait(
                    TableName=self.table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
                )
            table = self.client.describe_table(TableName=self.table_name)["Table"]
            indexes = {i["IndexName"] for i in table.get("GlobalSecondaryIndexes", [])}
            if ORPHAN_INDEX not in indexes:
                raise ConfigurationError(
                    f"table {self.table_name!r} exists without the {ORPHAN_INDEX!r} index "
                    "(see docs/dynamodb.md for the schema)"
                )
            ttl = self.client.describe_time_to_live(TableName=self.table_name)
            status = ttl.get("TimeToLiveDescription", {}).get("TimeToLiveStatus")
            if status not in ("ENABLED", "ENABLING"):
                self.client.update_time_to_live(
                    TableName=self.table_name,
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"},
                )
        except (self._client_error, self._botocore_error) as exc:
            raise LeaseBackendError(f"cannot set up table {self.table_name!r}: {exc}") from exc

    # -- requests -------------------------------------------------------------------------------

    def _call(self, what: str, method: Callable[..., Any], params: dict[str, Any]) -> Any:
        try:
            return method(**params)
        except self._client_error as exc:
            if _error_code(exc) == "ConditionalCheckFailedException":
                raise _ConditionFailed(exc.response.get("Item")) from None  # type: ignore[arg-type]
            raise LeaseBackendError(f"DynamoDB {what} failed: {exc}") from exc
        except self._botocore_error as exc:
            raise LeaseBackendError(f"DynamoDB {what} failed: {exc}") from exc

    def _update(
        self,
        key: str,
        update: str,
        condition: str | None,
        values: Mapping[str, object],
        *,
        returns: str = "NONE",
        sk: str = LEASE_SK,
    ) -> dict[str, Any]:
        """One conditional UpdateItem on ``key``'s lease item. Raises :class:`_ConditionFailed`
        with the ALL_OLD image when the condition is false."""
        text = f"{update} {condition or ''}"
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": {"pk": {"S": key}, "sk": {"S": sk}},
            "UpdateExpression": update,
            "ExpressionAttributeNames": {n: _NAMES[n] for n in set(_NAME_RE.findall(text))},
            "ReturnValues": returns,
        }
        used = set(_VALUE_RE.findall(text))
        if used:
            params["ExpressionAttributeValues"] = {
                name: _av(value) for name, value in values.items() if name in used
            }
        if condition:
            params["ConditionExpression"] = condition
            params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        response = self._call("UpdateItem", self.client.update_item, params)
        return dict(response.get("Attributes") or {})

    def _read(self, key: str) -> _Lease:
        response = self._call(
            "GetItem",
            self.client.get_item,
            {
                "TableName": self.table_name,
                "Key": {"pk": {"S": key}, "sk": {"S": LEASE_SK}},
                "ConsistentRead": True,
            },
        )
        return _Lease.parse(response.get("Item"))

    def _payloads(self, key: str, refs: Sequence[str]) -> dict[str, str]:
        """Stored signal records by ref (consistent reads); refs whose item is gone (TTL) are
        missing from the result."""
        found: dict[str, str] = {}
        for start in range(0, len(refs), _BATCH_GET):
            keys = [
                {"pk": {"S": key}, "sk": {"S": SIGNAL_SK_PREFIX + ref}}
                for ref in dict.fromkeys(refs[start : start + _BATCH_GET])
            ]
            for _ in range(_OPTIMISTIC_ATTEMPTS):
                response = self._call(
                    "BatchGetItem",
                    self.client.batch_get_item,
                    {
                        "RequestItems": {
                            self.table_name: {
                                "Keys": keys,
                                "ConsistentRead": True,
                                "ProjectionExpression": "#sk, #r",
                                "ExpressionAttributeNames": {"#sk": "sk", "#r": "r"},
                            }
                        }
                    },
                )
                for item in response.get("Responses", {}).get(self.table_name, []):
                    found[str(item["sk"]["S"])[len(SIGNAL_SK_PREFIX) :]] = str(item["r"]["S"])
                keys = response.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys")
                if not keys:
                    break
                time.sleep(random.uniform(0.005, 0.05))
            else:
                raise LeaseBackendError(f"DynamoDB kept throttling payload reads of {key!r}")
        return found

    def _put_signal(self, key: str, signal_id: str, record: str, now: int) -> str:
        ref = _nonce()
        self._call(
            "PutItem",
            self.client.put_item,
            {
                "TableName": self.table_name,
                "Item": {
                    "pk": {"S": key},
                    "sk": {"S": SIGNAL_SK_PREFIX + ref},
                    "i": {"S": signal_id},
                    "r": {"S": record},
                    "ttl": {"N": str(now // 1000 + self.retention_s)},
                },
            },
        )
        return ref

    def _delete_signals(self, key: str, refs: Sequence[str]) -> None:
        """Best-effort removal of payload items nothing references any more: a failure leaves
        garbage that the items' own TTL removes, and must not fail the step that completed."""
        requests = [
            {"DeleteRequest": {"Key": {"pk": {"S": key}, "sk": {"S": SIGNAL_SK_PREFIX + ref}}}}
            for ref in dict.fromkeys(refs)
        ]
        for start in range(0, len(requests), _BATCH_WRITE):
            pending: Any = requests[start : start + _BATCH_WRITE]
            for _ in range(8):
                try:
                    response = self._call(
                        "BatchWriteItem",
                        self.client.batch_write_item,
                        {"RequestItems": {self.table_name: pending}},
                    )
                except LeaseBackendError:
                    return
                pending = response.get("UnprocessedItems", {}).get(self.table_name)
                if not pending:
                    break
                time.sleep(random.uniform(0.005, 0.05))

    def _times(self) -> tuple[int, int]:
        now = int(self._clock())
        return now, now - self.clock_skew_ms

    def _ttl(self, until_ms: int) -> int:
        return until_ms // 1000 + self.retention_s

    def _shard(self, key: str) -> str:
        return f"orph#{zlib.crc32(key.encode('utf-8')) % self.orphan_shards}"

    # -- the contract ---------------------------------------------------------------------------

    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            nonce = _nonce()
            try:
                # A dead owner's in-flight signals are not this owner's to complete: they go
                # back to the head of the queue (the key stays in the orphan index).
                attrs = self._update(
                    key,
                    "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one, #c = :true,"
                    " #w = :w, #ttl = :ttl,"
                    " #q = list_append(if_not_exists(#f, :empty), if_not_exists(#q, :empty)),"
                    " #qn = list_append(if_not_exists(#fn, :empty), if_not_exists(#qn, :empty))"
                    " REMOVE #p, #k, #kn, #f, #fn",
                    _FREE_FOR_ME,
                    {
                        ":me": owner,
                        ":exp": now + ttl_ms,
                        ":floor": now * 1000,
                        ":one": 1,
                        ":true": True,
                        ":w": nonce,
                        ":ttl": self._ttl(now + ttl_ms),
                        ":now": now,
                        ":cutoff": cutoff,
                        ":empty": [],
                    },
                    returns="UPDATED_NEW",
                )
                return LeaseResult(True, owner, _n(attrs, "t"))
            except _ConditionFailed as failed:
                old = failed.lease
            if old.write_id == nonce:  # a botocore retry of the grant above, applied earlier
                return LeaseResult(True, owner, old.token)
            if old.live_owner(owner, now):
                if old.token is not None and self._refresh(key, owner, old.token, ttl_ms):
                    return LeaseResult(True, owner, old.token)
                continue
            if old.holder(cutoff) is not None:
                return LeaseResult(False, old.holder(cutoff), old.token)
        raise LeaseBackendError(f"acquire of {key!r} did not settle under contention")

    def _refresh(self, key: str, owner: str, token: int, ttl_ms: int) -> bool:
        """The current owner acquiring again: a new deadline, the same token."""
        now, _ = self._times()
        try:
            self._update(
                key,
                "SET #e = :exp, #ttl = :ttl",
                "#o = :me AND #t = :tok AND #e > :now",
                {
                    ":me": owner,
                    ":tok": token,
                    ":exp": now + ttl_ms,
                    ":ttl": self._ttl(now + ttl_ms),
                    ":now": now,
                },
            )
        except _ConditionFailed:
            return False
        return True

    def _get_owner(self, key: str) -> str | None:
        _, cutoff = self._times()
        return self._read(key).holder(cutoff)

    def _release(self, key: str, owner: str) -> None:
        now, _ = self._times()
        try:
            old = self._update(
                key,
                "SET #p = :me, #w = :w, #gx = :zero, #ttl = :ttl REMOVE #o, #c, #k, #kn, #f, #fn",
                _LIVE_OWNER,
                {":me": owner, ":w": _nonce(), ":zero": 0, ":ttl": self._ttl(now), ":now": now},
                returns="UPDATED_OLD",
            )
        except _ConditionFailed:
            return  # not the owner (or a retry of a release that was applied): nothing to do
        completed = _strings(old, "fn")
        if completed:
            self._delete_signals(key, completed)

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        now, _ = self._times()
        try:
            self._update(
                key,
                "SET #e = :exp, #ttl = :ttl",
                _LIVE_OWNER + _same_grant(token),
                {
                    ":me": owner,
                    ":exp": now + ttl_ms,
                    ":ttl": self._ttl(now + ttl_ms),
                    ":now": now,
                    ":grant": token,
                },
            )
        except _ConditionFailed:
            return False
        return True

    def _transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        now, cutoff = self._times()
        nonce = _nonce()
        try:
            old = self._update(
                key,
                "SET #o = :to, #e = :exp, #t = #t + :one, #c = :true, #p = :me, #w = :w,"
                " #ttl = :ttl REMOVE #k, #kn, #f, #fn",
                _LIVE_OWNER,
                {
                    ":me": from_owner,
                    ":to": to_owner,
                    ":exp": now + ttl_ms,
                    ":one": 1,
                    ":true": True,
                    ":w": nonce,
                    ":ttl": self._ttl(now + ttl_ms),
                    ":now": now,
                },
                returns="UPDATED_OLD",
            )
        except _ConditionFailed as failed:
            old_lease = failed.lease
            # A retry of a transfer that was applied (by this call, or by an earlier call whose
            # reply was lost) reports success, as on Redis.
            return old_lease.write_id == nonce or (
                old_lease.holder(cutoff) == to_owner and old_lease.previous == from_owner
            )
        completed = _strings(old, "fn")
        if completed:
            self._delete_signals(key, completed)
        return True

    # -- the signal queue -----------------------------------------------------------------------

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int
    ) -> LeaseResult:
        me = signal.id
        now, _ = self._times()
        # Whatever happens next, the signal's payload is needed: the new owner's own signal is
        # kept in flight (re-delivered if its process dies) and a queued one waits in the queue.
        # Written first, so no lease item ever references a payload that is not there yet.
        ref = self._put_signal(key, me, record, now)
        kept = False
        try:
            for _ in range(_OPTIMISTIC_ATTEMPTS):
                now, cutoff = self._times()
                nonce = _nonce()
                try:
                    attrs = self._update(
                        key,
                        "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one,"
                        " #c = :true, #w = :w, #f = :f, #fn = :fn, #gp = :shard, #gx = :exp,"
                        " #ttl = :ttl REMOVE #p, #k, #kn",
                        f"{_TAKEOVER} AND {_NOTHING_PENDING}",
                        {
                            ":me": me,
                            ":exp": now + ttl_ms,
                            ":floor": now * 1000,
                            ":one": 1,
                            ":zero": 0,
                            ":true": True,
                            ":w": nonce,
                            ":f": [me],
                            ":fn": [ref],
                            ":shard": self._shard(key),
                            ":ttl": self._ttl(now + ttl_ms),
                            ":cutoff": cutoff,
                        },
                        returns="UPDATED_NEW",
                    )
                    kept = True
                    return LeaseResult(True, me, _n(attrs, "t"))
                except _ConditionFailed as failed:
                    old = failed.lease
                if old.write_id == nonce:  # a botocore retry of the grant, applied earlier
                    kept = True
                    return LeaseResult(True, me, old.token)
                holder = old.holder(cutoff)
                if holder is not None:
                    if holder == me or me in old.in_flight:
                        # A second delivery of a signal that runs (or was taken) already.
                        return LeaseResult(False, holder, old.token, position=None)
                    if me in old.queue:
                        position = old.queue.index(me) + 1
                        return LeaseResult(False, holder, old.token, position=position)
                    queued = self._append(key, me, ref, cutoff)
                    if queued is not None:
                        result, kept = queued
                        return result
                    continue
                # Free, but the previous owner died with work pending: that work goes first.
                # The ALL_OLD image is a consistent snapshot, and its write id the version the
                # adoption is conditional on, so no extra read is needed.
                if not old.pending:
                    continue
                adopted = self._grant_orphan(key, old, ttl_ms, True, (me, ref), now, cutoff)
                if isinstance(adopted, Signal):
                    kept = me not in old.queue + old.in_flight
                    return LeaseResult(True, adopted.id, adopted.token, adopted=adopted)
            raise LeaseBackendError(f"acquire_or_enqueue on {key!r} did not settle")
        finally:
            if not kept:
                self._delete_signals(key, [ref])

    def _append(self, key: str, me: str, ref: str, cutoff: int) -> tuple[LeaseResult, bool] | None:
        """Queue ``me`` behind a live holder: one conditional write, so the holder cannot finish
        and leave between our check and the append (no lost wakeup). Returns the result and
        whether our payload item ``ref`` is the one referenced; ``None`` when the key changed
        hands and the caller must look again."""
        try:
            new = _Lease.parse(
                self._update(
                    key,
                    "SET #q = list_append(if_not_exists(#q, :empty), :id),"
                    " #qn = list_append(if_not_exists(#qn, :empty), :ref),"
                    " #gp = :shard, #gx = #e, #w = :w",
                    "attribute_exists(#o) AND #o <> :me AND #e >= :cutoff"
                    " AND NOT contains(#q, :me) AND NOT contains(#f, :me)",
                    {
                        ":me": me,
                        ":id": [me],
                        ":ref": [ref],
                        ":empty": [],
                        ":shard": self._shard(key),
                        ":w": _nonce(),
                        ":cutoff": cutoff,
                    },
                    returns="ALL_NEW",
                )
            )
        except _ConditionFailed as failed:
            old = failed.lease
            holder = old.holder(cutoff)
            if holder is None:
                return None
            if me in old.queue:
                index = old.queue.index(me)
                # Queued by a retry of this very request (our payload) or by a duplicate.
                mine = index < len(old.queue_refs) and old.queue_refs[index] == ref
                return LeaseResult(False, holder, old.token, position=index + 1), mine
            if holder == me or me in old.in_flight:
                return LeaseResult(False, holder, old.token, position=None), False
            return None
        return LeaseResult(False, new.owner, new.token, position=len(new.queue)), True

    def _take(self, key: str, owner: str, limit: int, token: int | None = None) -> list[Signal]:
        taken_ids: list[str] = []
        taken_refs: list[str] = []
        attempts = 0
        while len(taken_ids) < limit:
            attempts += 1
            if attempts > _OPTIMISTIC_ATTEMPTS + limit // _TAKE_BATCH:
                raise LeaseBackendError(f"take_signals on {key!r} did not settle")
            now, cutoff = self._times()
            lease = self._read(key)
            if not lease.live_grant(owner, now, token):
                if taken_ids:
                    break  # what we moved is in flight for us; adopt re-delivers it if we died
                raise LeaseLostError(key, owner, lease.holder(cutoff))
            n = min(limit - len(taken_ids), len(lease.queue), _TAKE_BATCH)
            if n == 0:
                break
            ids, refs = lease.queue[:n], lease.queue_refs[:n]
            nonce = _nonce()
            removes = ", ".join(f"#q[{i}], #qn[{i}]" for i in range(n))
            try:
                self._update(
                    key,
                    f"REMOVE {removes} SET #f = list_append(if_not_exists(#f, :empty), :ids),"
                    " #fn = list_append(if_not_exists(#fn, :empty), :refs),"
                    " #k = :k, #kn = :n, #w = :k",
                    # Only the owner removes from the head, and only under its token: if the
                    # head is still the one we read, the first n entries are too. Appends at
                    # the tail by forwarders do not conflict.
                    f"{_LIVE_OWNER} AND #t = :tok AND #q[0] = :head",
                    {
                        ":me": owner,
                        ":now": now,
                        ":tok": lease.token,
                        ":head": ids[0],
                        ":ids": list(ids),
                        ":refs": list(refs),
                        ":empty": [],
                        ":k": nonce,
                        ":n": n,
                    },
                )
            except _ConditionFailed as failed:
                if failed.lease.take_nonce != nonce:
                    continue
            taken_ids += ids
            taken_refs += refs
            if n == len(lease.queue):
                break  # we took all there was; later arrivals wait for the next call
        payloads = self._payloads(key, taken_refs)
        return [
            decode_signal(signal_id, payloads[ref])
            for signal_id, ref in zip(taken_ids, taken_refs, strict=True)
            if ref in payloads
        ]

    def _transfer_to_next(
        self, key: str, owner: str, ttl_ms: int, claim: bool, token: int | None = None
    ) -> Signal | None:
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            # Most owners finish with nothing queued, so first try to release in one write,
            # conditional on the queue being empty (a forwarder that appended meanwhile makes
            # it fail: no lost wakeup). A refusal's ALL_OLD image is the consistent snapshot
            # the hand-off works from, so no separate read is needed.
            released = self._release_if_idle(key, owner, now, token)
            if not isinstance(released, _Lease):
                if released:
                    self._delete_signals(key, released)
                return None
            lease = released
            if not lease.live_grant(owner, now, token):
                # A retry of a step that was applied, by this grant: a release keeps its token,
                # a hand-off raised it by one.
                ours = token is None or lease.token == (token if lease.owner is None else token + 1)
                if lease.previous == owner and ours:
                    holder = lease.holder(cutoff)
                    if holder is None:
                        return None
                    if holder in lease.in_flight:
                        ref = lease.in_flight_refs[lease.in_flight.index(holder)]
                        stored = self._payloads(key, [ref]).get(ref)
                        if stored is not None:
                            return decode_signal(holder, stored, lease.token)
                raise LeaseLostError(key, owner, lease.holder(cutoff))
            if not lease.queue:
                continue  # emptied between the two (cannot happen with one owner): again
            result = self._hand_off(key, lease, owner, ttl_ms, claim, now)
            if not isinstance(result, _Retry):
                if lease.in_flight_refs:
                    self._delete_signals(key, lease.in_flight_refs)
                return result
        raise LeaseBackendError(f"transfer_to_next on {key!r} did not settle")

    def _release_if_idle(
        self, key: str, owner: str, now: int, token: int | None = None
    ) -> tuple[str, ...] | _Lease:
        """Release when ``owner`` holds the key and nothing is queued: returns the payload
        refs it completed. Otherwise nothing changes and the item as it stands is returned."""
        nonce = _nonce()
        try:
            old = self._update(
                key,
                "SET #p = :me, #w = :w, #ttl = :ttl"
                " REMOVE #o, #c, #k, #kn, #f, #fn, #q, #qn, #gp, #gx",
                f"{_LIVE_OWNER}{_same_grant(token)}"
                " AND (attribute_not_exists(#q) OR size(#q) = :zero)",
                {
                    ":me": owner,
                    ":now": now,
                    ":zero": 0,
                    ":w": nonce,
                    ":ttl": self._ttl(now),
                    ":grant": token,
                },
                returns="ALL_OLD",
            )
        except _ConditionFailed as failed:
            old_lease = failed.lease
            if old_lease.write_id == nonce:  # a botocore retry of this very release
                return ()
            return old_lease
        return _strings(old, "fn")

    def _hand_off(
        self, key: str, lease: _Lease, owner: str, ttl_ms: int, claim: bool, now: int
    ) -> Signal | _Retry | None:
        assert lease.token is not None
        head_at, stored = self._first_payload(key, lease.queue_refs)
        nonce = _nonce()
        in_flight = len(lease.in_flight)
        values: dict[str, object] = {
            ":me": owner,
            ":now": now,
            ":tok": lease.token,
            ":zero": 0,
            ":nf": in_flight,
            ":w": nonce,
        }
        same_flight = (
            "(attribute_not_exists(#f) OR size(#f) = :zero)"
            if in_flight == 0
            else "(attribute_exists(#f) AND size(#f) = :nf)"
        )
        condition = f"{_LIVE_OWNER} AND #t = :tok AND {same_flight}"
        if stored is None:
            # Nothing to hand to: release, unless a forwarder appended since our read.
            values[":ttl"] = self._ttl(now)
            if lease.queue:  # every queued payload is gone (TTL): drop them with the lease
                condition += " AND #q[0] = :head AND size(#q) = :nq"
                values[":head"] = lease.queue[0]
                values[":nq"] = len(lease.queue)
            else:
                condition += " AND (attribute_not_exists(#q) OR size(#q) = :zero)"
            try:
                self._update(
                    key,
                    "SET #p = :me, #w = :w, #ttl = :ttl"
                    " REMOVE #o, #c, #k, #kn, #f, #fn, #q, #qn, #gp, #gx",
                    condition,
                    values,
                )
            except _ConditionFailed as failed:
                old = failed.lease
                if old.write_id == nonce or (old.owner is None and old.previous == owner):
                    return None
                return _RETRY
            return None
        head = lease.queue[head_at]
        token = lease.token + 1
        removes = ", ".join(f"#q[{i}], #qn[{i}]" for i in range(head_at + 1))
        values.update(
            {
                ":head": lease.queue[0],
                ":next": head,
                ":exp": now + ttl_ms,
                ":new": token,
                ":claimed": claim,
                ":f": [head],
                ":fn": [lease.queue_refs[head_at]],
                ":shard": self._shard(key),
                ":ttl": self._ttl(now + ttl_ms),
            }
        )
        try:
            self._update(
                key,
                f"REMOVE {removes}, #k, #kn SET #o = :next, #e = :exp, #t = :new,"
                " #c = :claimed, #p = :me, #w = :w, #f = :f, #fn = :fn, #gp = :shard,"
                " #gx = :exp, #ttl = :ttl",
                f"{condition} AND #q[0] = :head",
                values,
            )
        except _ConditionFailed as failed:
            old = failed.lease
            applied = old.write_id == nonce or (
                old.owner == head and old.previous == owner and old.token == token
            )
            if not applied:
                return _RETRY
        return decode_signal(head, stored, token)

    def _first_payload(self, key: str, refs: Sequence[str]) -> tuple[int, str | None]:
        """Index and record of the first ref whose payload item still exists (normally the
        first one; payloads only vanish through their TTL)."""
        start = 0
        for size in _growing_chunks():
            chunk = refs[start : start + size]
            if not chunk:
                return 0, None
            found = self._payloads(key, chunk)
            for offset, ref in enumerate(chunk):
                if ref in found:
                    return start + offset, found[ref]
            start += len(chunk)
        return 0, None  # pragma: no cover - _growing_chunks never ends

    def _grant_orphan(
        self,
        key: str,
        lease: _Lease,
        ttl_ms: int,
        claim: bool,
        extra: tuple[str, str] | None,
        now: int,
        cutoff: int,
    ) -> Signal | _Retry | None:
        """The owner died (or released) with work pending: put what it had in flight back at
        the head, queue ``extra`` behind everything, and make the head the owner. One write,
        conditional on the item being exactly as read and still free."""
        ids = list(lease.in_flight + lease.queue)
        refs = list(lease.in_flight_refs + lease.queue_refs)
        if extra is not None and extra[0] not in ids:
            ids.append(extra[0])
            refs.append(extra[1])
        head_at, stored = self._first_payload(key, refs)
        nonce = _nonce()
        unchanged = "#w = :was" if lease.write_id is not None else "attribute_not_exists(#w)"
        free = _TAKEOVER
        values: dict[str, object] = {
            ":was": lease.write_id or "",
            ":cutoff": cutoff,
            ":w": nonce,
        }
        if stored is None:
            try:
                self._update(
                    key,
                    "SET #w = :w REMOVE #q, #qn, #f, #fn, #gp, #gx",
                    f"{unchanged} AND {free}",
                    values,
                )
            except _ConditionFailed as failed:
                return None if failed.lease.write_id == nonce else _RETRY
            return None
        head = ids[head_at]
        rest_ids, rest_refs = ids[head_at + 1 :], refs[head_at + 1 :]
        token = lease.token + 1 if lease.token is not None else now * 1000 + 1
        values.update(
            {
                ":next": head,
                ":exp": now + ttl_ms,
                ":new": token,
                ":claimed": claim,
                ":f": [head],
                ":fn": [refs[head_at]],
                ":q": rest_ids,
                ":qn": rest_refs,
                ":shard": self._shard(key),
                ":ttl": self._ttl(now + ttl_ms),
            }
        )
        queue = ", #q = :q, #qn = :qn" if rest_ids else ""
        drop = "" if rest_ids else ", #q, #qn"
        try:
            self._update(
                key,
                "SET #o = :next, #e = :exp, #t = :new, #c = :claimed, #w = :w, #f = :f,"
                f" #fn = :fn, #gp = :shard, #gx = :exp, #ttl = :ttl{queue}"
                f" REMOVE #p, #k, #kn{drop}",
                f"{unchanged} AND {free}",
                values,
            )
        except _ConditionFailed as failed:
            if failed.lease.write_id != nonce:
                return _RETRY
        return decode_signal(head, stored, token)

    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        now, _ = self._times()
        lease = self._read(key)
        if not lease.live_owner(owner, now) or lease.token != token or lease.claimed:
            return None
        if owner not in lease.in_flight:
            return None
        ref = lease.in_flight_refs[lease.in_flight.index(owner)]
        stored = self._payloads(key, [ref]).get(ref)
        if stored is None:
            return None
        nonce = _nonce()
        try:
            self._update(
                key,
                "SET #c = :true, #e = :exp, #ttl = :ttl, #k = :k, #w = :k",
                f"{_LIVE_OWNER} AND #t = :tok AND #c = :false",
                {
                    ":me": owner,
                    ":now": now,
                    ":tok": token,
                    ":true": True,
                    ":false": False,
                    ":exp": now + ttl_ms,
                    ":ttl": self._ttl(now + ttl_ms),
                    ":k": nonce,
                },
            )
        except _ConditionFailed as failed:
            if failed.lease.take_nonce != nonce:
                return None  # claimed before (a duplicate delivery), or the lease moved
        return decode_signal(owner, stored, token)

    def _pending(self, key: str) -> int:
        return len(self._read(key).queue)

    def _adopt(self, ttl_ms: int, limit: int, claim: bool) -> list[tuple[str, Signal]]:
        adopted: list[tuple[str, Signal]] = []
        first = random.randrange(self.orphan_shards)  # no shard starves behind another
        for step in range(self.orphan_shards):
            shard = f"orph#{(first + step) % self.orphan_shards}"
            for key in self._orphan_candidates(shard):
                signal = self._adopt_key(key, ttl_ms, claim)
                if signal is not None:
                    adopted.append((key, signal))
                    if len(adopted) >= limit:
                        return adopted
        return adopted

    def _orphan_candidates(self, shard: str) -> Iterator[str]:
        """Keys in one index shard whose indexed deadline passed, oldest first. The index is
        eventually consistent and its deadline a hint: every candidate is re-checked."""
        _, cutoff = self._times()
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": ORPHAN_INDEX,
            "KeyConditionExpression": "#gp = :g AND #gx < :cutoff",
            "ExpressionAttributeNames": {"#gp": "gp", "#gx": "gx"},
            "ExpressionAttributeValues": {":g": {"S": shard}, ":cutoff": {"N": str(cutoff)}},
        }
        while True:
            page = self._call("Query", self.client.query, params)
            for item in page.get("Items", []):
                yield str(item["pk"]["S"])
            start = page.get("LastEvaluatedKey")
            if not start:
                return
            params["ExclusiveStartKey"] = start

    def _adopt_key(self, key: str, ttl_ms: int, claim: bool) -> Signal | None:
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            lease = self._read(key)
            if not lease.exists or not lease.indexed:
                return None
            if lease.holder(cutoff) is not None:
                if lease.index_at is None or lease.index_at < cutoff:
                    # The owner renewed since it was indexed: move its entry to its deadline.
                    try:
                        self._update(
                            key,
                            "SET #gx = #e",
                            "attribute_exists(#gp) AND attribute_exists(#o) AND #e >= :cutoff",
                            {":cutoff": cutoff},
                        )
                    except _ConditionFailed:
                        continue
                return None
            result = self._grant_orphan(key, lease, ttl_ms, claim, None, now, cutoff)
            if not isinstance(result, _Retry):
                return result
        raise LeaseBackendError(f"adopting {key!r} did not settle")

    def _inspect(self, key: str) -> KeyState:
        now, cutoff = self._times()
        lease = self._read(key)
        payloads = self._payloads(key, lease.queue_refs)
        holder = lease.holder(cutoff)
        return KeyState(
            key=key,
            owner=holder,
            token=lease.token if holder is not None else None,
            remaining_ms=max(lease.expiry - now, 0) if holder is not None else None,
            queued=tuple(
                decode_signal(signal_id, payloads[ref])
                for signal_id, ref in zip(lease.queue, lease.queue_refs, strict=True)
                if ref in payloads
            ),
            in_flight=lease.in_flight,
        )


def _same_grant(token: int | None) -> str:
    """The condition that limits an owner-side write to the grant with ``token`` (``:grant``)."""
    return "" if token is None else " AND #t = :grant"


def _growing_chunks() -> Iterator[int]:
    yield 1
    while True:
        yield _BATCH_GET


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class _SharedSession:
    """One boto3 session per process: it caches the parsed service model, which makes every
    further client cheap. Sessions are not thread-safe, so clients are made under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session: Any = None

    def client(self, **options: Any) -> DynamoDBClient:
        import boto3

        with self.lock:
            if self.session is None:
                self.session = boto3.session.Session()
            client: DynamoDBClient = self.session.client("dynamodb", **options)
            return client

    def forget(self) -> None:
        # A forked child must not inherit a lock that another thread held at fork time.
        self.lock = threading.Lock()
        self.session = None


_SHARED = _SharedSession()
os.register_at_fork(after_in_child=_SHARED.forget)


def _build_client(
    endpoint_url: str | None, region_name: str | None, retry_config: Config | None
) -> DynamoDBClient:
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError

    config = Config(
        retries={"mode": "standard", "total_max_attempts": DEFAULT_MAX_ATTEMPTS},
        connect_timeout=2,
        read_timeout=5,
        tcp_keepalive=True,
    )
    if retry_config is not None:
        config = config.merge(retry_config)
    try:
        return _SHARED.client(endpoint_url=endpoint_url, region_name=region_name, config=config)
    except BotoCoreError as exc:
        raise ConfigurationError(f"cannot build a DynamoDB client: {exc}") from exc
