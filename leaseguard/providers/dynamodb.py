"""Leases and signal queues on DynamoDB: one conditional ``UpdateItem`` per lease operation.

**Requests.** ``acquire_lease``, ``renew_lease``, ``release_lease`` and ``transfer_lease`` are
each one conditional ``UpdateItem``. A refused acquire names the holder from the same request
(``ReturnValuesOnConditionCheckFailure=ALL_OLD``); a failed condition is a normal result, never
an exception. Two documented exceptions: an acquire by the *current* owner (which must keep its
token, and a single update expression cannot both keep and raise it) sends a second, conditional
refresh after the first write's ``ALL_OLD`` showed the caller already holds the key; and a
release or transfer of a lease that carried in-flight signals completes them ([G6]) with a
second write conditional on the first refusal's snapshot, then deletes their payload items (one
``BatchWriteItem`` per 25); only keys used through the signal queue have any.

**Items.** One table, key ``pk`` (S) + ``sk`` (S), all of a key's items in one partition:

* the lease item, ``pk=<key>``, ``sk="lease"``: ``o`` owner, ``e`` expiry (epoch ms, caller's
  clock), ``t`` fencing token, ``c`` claimed, ``p``/``pt`` the owner that handed over or released
  last and its token, ``w`` the grant nonce (written only by the call that made or claimed the
  grant: [Q1] [Q6] [D1] [C1]), ``v`` the version (a fresh nonce on every write except appends,
  renewals and index moves; snapshot-based writes are conditional on it), ``k``/``kn`` nonce and
  size of the owner's last take, ``q``/``qn`` queued signal ids and their payload refs (parallel
  lists, FIFO), ``f``/``fn`` the same for signals in flight, ``a`` failed-attempt counts of
  stored signals (sparse map), ``d`` the completed-id memory ([G2] [G6]: batches of ids, each
  ended by a marker ``±(at * 10**20 + token)``), ``x``/``xn`` dead-lettered ids and their
  payload refs, ``h`` halted (present only while halted: [G6] sets it under
  ``on_poison="halt"``, [V1] removes it), ``ttl`` (epoch seconds), ``gp``/``gx`` for the orphan
  index and ``gd`` for the dead-letter index;
* one payload item per signal, ``sk="sig#<ref>"`` with a random ``ref``, holding ``i`` (signal
  id), ``r`` (:func:`~leaseguard.signals.encode_signal` text), ``ttl``, and for a dead letter
  ``de``/``da``/``df`` (error, attempts, when). Payloads live outside the lease item so a
  renewal stays one write unit; the random ref means deleting a completed payload can never
  delete a later signal that reused the same id. Only a completing owner deletes payloads (the
  ones its write removed from the lease item); an enqueuer never does, since a write of its own
  may still be applied after its reply was lost: unreferenced payloads are reaped by their TTL.
  A record too large for one item (over ``ITEM_RECORD_BYTES``, ~392 KiB) is split: its ref is
  ``<random>.<n>``, the head item holds the first piece as ``r`` and ``sig#<ref>#1`` ...
  ``sig#<ref>#<n-1>`` the others (each with ``i`` and the same ``ttl``). All are written (with
  ``BatchWriteItem``) before the lease write that references the ref, read in the same
  ``BatchGetItem`` as other payloads and joined, renewed and deleted together; a payload with
  any item gone counts as gone.

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
re-indexed when the sweep meets it. A halted key leaves the index ([N1] with ``h``; a sweep
that meets one anyway removes it, [D4]); a redrive ([V1]) puts it back.

**Dead letters.** ``gd`` is the key of a second sparse GSI (``dead_letters``, keys only), set
to one of ``orphan_shards`` values by the write that dead-letters a signal and removed by the
redrive that moves the last one: :meth:`dead_letter_keys` queries it, never a Scan.

**Backpressure.** A forward that would be queued behind ``max_queue`` others is refused
([Q8], :class:`~leaseguard.errors.QueueFull`): the append is conditional on the queue's size,
and the refused call deletes the payload item it wrote (the refusal shows that no write of the
call references it).

**Retries.** botocore retries throttling, 5xx, timeouts and connection errors (standard mode,
4 attempts in all by default); what still fails is :class:`~leaseguard.errors.LeaseBackendError`.
A resent write whose first attempt was applied fails its own condition; the ``ALL_OLD`` image
then shows its version ``v`` (nobody wrote since), its grant nonce ``w`` ([Q7] [D3]: appends in
between do not touch it), its take nonce ``k`` ([K2]), its appended entry ([Q3]), ``p``/``pt``
or the completed-id memory ([N4] [T3]), and the call reports the applied result. Every
condition and update expression names the row of :mod:`leaseguard.protocol.model` it
implements.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from leaseguard.config import DEFAULT_CLOCK_SKEW_MS
from leaseguard.errors import (
    ConfigurationError,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseLostError,
    QueueFull,
)
from leaseguard.protocol.model import DEDUPE_WINDOW_MS, DEFAULT_MAX_QUEUE, DONE_LIMIT, Failure
from leaseguard.signals import decode_signal
from leaseguard.types import DeadLetter, KeyState, LeaseResult, Signal
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES, check_positive_int

from .base import BaseLeaseProvider

if TYPE_CHECKING:
    from botocore.config import Config
    from mypy_boto3_dynamodb import DynamoDBClient

LEASE_SK = "lease"
SIGNAL_SK_PREFIX = "sig#"
ORPHAN_INDEX = "orphans"
DEAD_LETTER_INDEX = "dead_letters"
DEFAULT_RETENTION_S = 7 * 86_400
DEFAULT_ORPHAN_SHARDS = 8
DEFAULT_MAX_ATTEMPTS = 4
# DynamoDB's item limit is 400 KB; the key, the signal id, a dead letter's error and the
# attribute names of a payload item take at most a few KiB of it. A signal record (its payload
# plus the ``{"at":...,"p":...}`` envelope) of up to this many UTF-8 bytes is one item; a larger
# one is split into pieces of at most this size, one item each.
ITEM_RECORD_BYTES = 400 * 1024 - 8 * 1024 + 64
# The largest max_payload_bytes (the base providers' ceiling): 168 items, 7 BatchWriteItem.
DYNAMODB_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
# Separates a split payload's random ref from its item count (``<nonce>.<n>``) and a piece's
# index from the ref in its sort key (``sig#<nonce>.<n>#<i>``).
_SPLIT = "."
_PIECE = "#"
# How often one step re-reads and retries when another writer changed the item in between.
_OPTIMISTIC_ATTEMPTS = 32
# A take moves at most this many signals per write: an UpdateExpression is limited to 4 KB.
_TAKE_BATCH = 100
_BATCH_GET = 100
_BATCH_WRITE = 25
_BATCH_WRITE_BYTES = 12 * 1024 * 1024  # of a request's items as sent (DynamoDB allows 16 MB)
# The completed-id memory ([G2]): a completion marker in ``d`` is ``±(at * _MARK + token)``.
_MARK = 10**20
# Besides DONE_LIMIT ids, at most this many bytes of ids are remembered (ids may be 1 KiB each;
# the lease item, which every write pays for, must stay far below DynamoDB's 400 KB).
DONE_BYTES = 64 * 1024
# A completer prunes forgotten entries from the head of ``d`` once this many have piled up.
_PRUNE_MIN = 64
_PRUNE_MAX = 128  # elements per prune write (an UpdateExpression is limited to 4 KB)

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
        "pt",
        "w",
        "v",
        "k",
        "kn",
        "q",
        "qn",
        "f",
        "fn",
        "ttl",
        "gp",
        "gx",
        "gd",
        "h",
        "a",
        "d",
        "x",
        "xn",
        "i",
        "r",
        "de",
        "da",
        "df",
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
    if isinstance(value, bytes):
        return {"B": value}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, (list, tuple)):
        return {"L": [_av(v) for v in value]}
    if isinstance(value, dict):
        return {"M": {str(k): _av(v) for k, v in value.items()}}
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
class _Done:
    """One remembered completion ([G6]): the grant's token (0 when the completing call named
    none), when, whether it succeeded (a failed one is not deduplicated) and, for a failed
    own event, its failed runs so far (its platform retry resumes them: [Q1] [Q2] [Q6] [Q9])."""

    token: int
    at: int
    ok: bool
    attempts: int = 0


def _marker(at: int, token: int, ok: bool) -> int:
    value = at * _MARK + token
    return value if ok else -value


def _done_view(elements: Sequence[Mapping[str, Any]], now: int) -> dict[str, _Done]:
    """[G2] The completed ids the model remembers at ``now``, oldest first.

    ``d`` is a list of batches, each the ids one completion finished (S) followed by its marker
    (N, see :func:`_marker`). A later batch naming an id again replaces the earlier entry (as
    ``remember_done`` does); entries older than the dedupe window, and the oldest beyond
    DONE_LIMIT ids or DONE_BYTES bytes of ids, are forgotten even while still stored.
    """
    view: dict[str, _Done] = {}
    batch: list[tuple[str, int]] = []
    for element in elements:
        sid = _element_id(element)
        if sid is not None:
            batch.append((sid, _element_attempts(element)))
        elif "N" in element:
            value = int(element["N"])
            token, at, ok = abs(value) % _MARK, abs(value) // _MARK, value > 0
            for sid, attempts in batch:
                view.pop(sid, None)
                view[sid] = _Done(token, at, ok, 0 if ok else attempts)
            batch = []
    horizon = now - DEDUPE_WINDOW_MS
    ids = [sid for sid, done in view.items() if done.at > horizon]
    start, size = len(ids), 0
    while start > 0 and len(ids) - start < DONE_LIMIT:
        size += len(ids[start - 1].encode("utf-8")) + 1
        if size > DONE_BYTES:
            break
        start -= 1
    return {sid: view[sid] for sid in ids[start:]}


def _element_id(element: Mapping[str, Any]) -> str | None:
    """The id an element of ``d`` names: S for a completed id, L[S] or L[S, N] for an owner
    whose run failed (nested, so that ``contains(#d, :me)`` only matches ids to deduplicate;
    the N is its failed runs so far). A B element (:func:`_resume_tag`) names no entry."""
    if "S" in element:
        return str(element["S"])
    if "L" in element and element["L"] and "S" in element["L"][0]:
        return str(element["L"][0]["S"])
    return None


def _element_attempts(element: Mapping[str, Any]) -> int:
    """The failed runs a failed owner's element (L[S, N]) carries; 0 for any other."""
    nested = element.get("L")
    if nested and len(nested) > 1 and "N" in nested[1]:
        return int(nested[1]["N"])
    return 0


def _resume_tag(signal_id: str) -> bytes:
    """The B element that follows a failed owner's L[S, N] element in ``d`` when N > 0: a
    scalar that the blind [Q1] / [Q2] writes can refuse on (``NOT contains(#d, :tag)``), since
    a signal stored anew with that id resumes the count and needs the snapshot-based write. A
    B value never equals an id (S) or a marker (N)."""
    return signal_id.encode("utf-8")


def _prunable(elements: Sequence[Mapping[str, Any]], view: Mapping[str, _Done]) -> int:
    """How many leading elements of ``d`` (whole batches, at most _PRUNE_MAX) hold nothing the
    view still needs: a batch whose ids were all forgotten or named again by a later batch."""
    final: dict[str, int] = {}
    for i, element in enumerate(elements):
        sid = _element_id(element)
        if sid is not None:
            final[sid] = i
    needed = {final[sid] for sid in view if sid in final}
    cut = 0
    for i, element in enumerate(elements[:_PRUNE_MAX]):
        if i in needed:
            break
        if "N" in element:
            cut = i + 1
    return cut


@dataclass(frozen=True)
class _Lease:
    """The lease item as read (or as returned by ``ALL_OLD``); absent attributes are empty.

    ``grant_nonce`` (``w``) names the call that made or claimed the current grant and is written
    only by those calls ([Q1] [Q6] [D1] [C1]); ``version`` (``v``) is a fresh nonce on every write
    except appends, renewals and index moves, and is what snapshot-based writes are conditional
    on (appends only add at the tail of ``q``, which those writes allow for explicitly).
    """

    exists: bool
    owner: str | None = None
    expiry: int = 0
    token: int | None = None
    claimed: bool = False
    previous: str | None = None
    prev_token: int | None = None
    grant_nonce: str | None = None
    version: str | None = None
    take_nonce: str | None = None
    queue: tuple[str, ...] = ()
    queue_refs: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()
    in_flight_refs: tuple[str, ...] = ()
    attempts: Mapping[str, int] = field(default_factory=dict)
    done: tuple[Mapping[str, Any], ...] = ()
    dead: tuple[str, ...] = ()
    dead_refs: tuple[str, ...] = ()
    indexed: bool = False
    index_at: int | None = None
    halted: bool = False

    @classmethod
    def parse(cls, item: Mapping[str, Any] | None) -> _Lease:
        if not item:
            return cls(exists=False)
        claimed = item.get("c")
        attempts = item.get("a")
        done = item.get("d")
        return cls(
            exists=True,
            owner=_s(item, "o"),
            expiry=_n(item, "e") or 0,
            token=_n(item, "t"),
            claimed=bool(claimed["BOOL"]) if claimed is not None else False,
            previous=_s(item, "p"),
            prev_token=_n(item, "pt"),
            grant_nonce=_s(item, "w"),
            version=_s(item, "v"),
            take_nonce=_s(item, "k"),
            queue=_strings(item, "q"),
            queue_refs=_strings(item, "qn"),
            in_flight=_strings(item, "f"),
            in_flight_refs=_strings(item, "fn"),
            attempts=({str(k): int(v["N"]) for k, v in attempts["M"].items()} if attempts else {}),
            done=tuple(done["L"]) if done else (),
            dead=_strings(item, "x"),
            dead_refs=_strings(item, "xn"),
            indexed="gp" in item,
            index_at=_n(item, "gx"),
            halted="h" in item,
        )

    def live_owner(self, owner: str, now: int) -> bool:
        """``owner`` holds the lease by its own clock (what owner-side steps require)."""
        return self.owner == owner and self.expiry > now

    def live_grant(self, owner: str, now: int, token: int | None) -> bool:
        """:meth:`live_owner`, with a token, and with exactly ``token`` when one is given."""
        return (
            self.live_owner(owner, now) and self.token is not None and token in (None, self.token)
        )

    def free_for(self, owner: str, now: int, cutoff: int) -> bool:
        """Free as far as ``owner`` is concerned (the condition ``_FREE_FOR_ME``): nobody holds
        it, or it is ``owner``'s own lease that ran out by ``owner``'s clock."""
        return (
            self.owner is None
            or self.expiry < cutoff
            or (self.owner == owner and self.expiry <= now)
        )

    def holder(self, cutoff: int) -> str | None:
        """Who holds the key as far as anyone else is concerned (the owner, also in limbo)."""
        if self.owner is not None and self.expiry >= cutoff:
            return self.owner
        return None

    @property
    def pending(self) -> bool:
        return bool(self.queue or self.in_flight)

    def ref_of(self, signal_id: str) -> str | None:
        """The payload ref of a stored (queued or in-flight) signal."""
        for ids, refs in ((self.in_flight, self.in_flight_refs), (self.queue, self.queue_refs)):
            if signal_id in ids:
                index = ids.index(signal_id)
                return refs[index] if index < len(refs) else None
        return None

    def unchanged(self) -> tuple[str, dict[str, object]]:
        """The condition that the item's version is still the one read."""
        if self.version is None:
            return "attribute_not_exists(#v)", {}
        return "#v = :was", {":was": self.version}

    def queue_unchanged(self) -> tuple[str, dict[str, object]]:
        """No append since the snapshot (appends do not change the version)."""
        if not self.queue:
            return "(attribute_not_exists(#q) OR size(#q) = :zero)", {":zero": 0}
        return "size(#q) = :nq", {":nq": len(self.queue)}


class _ConditionFailed(Exception):
    """A conditional write was refused; ``lease`` is the item as DynamoDB saw it (ALL_OLD)."""

    def __init__(self, item: Mapping[str, Any] | None) -> None:
        super().__init__("conditional check failed")
        self.lease = _Lease.parse(item)


class _Retry:
    """Returned by a step whose optimistic write lost to another writer: try again from
    ``lease`` (the ALL_OLD image of the refusal, a consistent snapshot), or read when None."""

    def __init__(self, lease: _Lease | None = None) -> None:
        self.lease = lease


@dataclass(frozen=True)
class _Then:
    """What a completion ([G6]) is followed by: ``free`` (release_lease [L4]), ``to`` (transfer
    the lease to ``to_owner`` [T1]) or ``next`` (hand off or release [N1] [N2] [N3])."""

    kind: str
    ttl_ms: int = 0
    claim: bool = True
    to_owner: str = ""


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
        max_queue: int = DEFAULT_MAX_QUEUE,
        clock: Callable[[], int] | None = None,
        retry_config: Config | None = None,
        retention_s: int = DEFAULT_RETENTION_S,
        orphan_shards: int = DEFAULT_ORPHAN_SHARDS,
    ) -> None:
        super().__init__(max_payload_bytes=max_payload_bytes, max_queue=max_queue)
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
        """Create the table (on-demand billing, the ``orphans`` and ``dead_letters`` GSIs) and
        enable TTL on ``ttl``. Idempotent: an existing table is checked for the indexes and
        left as it is."""
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
                    {"AttributeName": "gd", "AttributeType": "S"},
                ],
                GlobalSecondaryIndexes=[
                    {
                        "IndexName": ORPHAN_INDEX,
                        "KeySchema": [
                            {"AttributeName": "gp", "KeyType": "HASH"},
                            {"AttributeName": "gx", "KeyType": "RANGE"},
                        ],
                        "Projection": {"ProjectionType": "KEYS_ONLY"},
                    },
                    {
                        "IndexName": DEAD_LETTER_INDEX,
                        "KeySchema": [{"AttributeName": "gd", "KeyType": "HASH"}],
                        "Projection": {"ProjectionType": "KEYS_ONLY"},
                    },
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
            for index in (ORPHAN_INDEX, DEAD_LETTER_INDEX):
                if index not in indexes:
                    raise ConfigurationError(
                        f"table {self.table_name!r} exists without the {index!r} index "
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
        return {ref: str(item["r"]["S"]) for ref, item in self._payload_items(key, refs).items()}

    def _payload_items(
        self, key: str, refs: Sequence[str], extra: Sequence[str] = ()
    ) -> dict[str, dict[str, Any]]:
        """Payload items by ref (``r`` and the ``extra`` attributes), consistent reads. A split
        payload's pieces are read in the same requests and joined into ``r``; one whose head or
        any piece is gone (TTL) is missing from the result, as a payload item that is gone."""
        unique = list(dict.fromkeys(refs))
        got = self._get_items(
            key, [sk for ref in unique for sk in _item_sks(ref)], ["sk", "r", *extra]
        )
        found: dict[str, dict[str, Any]] = {}
        for ref in unique:
            parts = [got.get(sk) for sk in _item_sks(ref)]
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
            for _ in range(_OPTIMISTIC_ATTEMPTS):
                response = self._call(
                    "BatchGetItem",
                    self.client.batch_get_item,
                    {
                        "RequestItems": {
                            self.table_name: {
                                "Keys": keys,
                                "ConsistentRead": True,
                                "ProjectionExpression": ", ".join(f"#{n}" for n in names),
                                "ExpressionAttributeNames": {f"#{n}": n for n in names},
                            }
                        }
                    },
                )
                items = response.get("Responses", {}).get(self.table_name, [])
                for item in items:
                    found[str(item["sk"]["S"])] = dict(item)
                keys = response.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys")
                if not keys:
                    break
                if not items:  # throttled (a response over 16 MB still made progress)
                    time.sleep(random.uniform(0.005, 0.05))
            else:
                raise LeaseBackendError(f"DynamoDB kept throttling payload reads of {key!r}")
        return found

    def _stored_signal(
        self, key: str, lease: _Lease, signal_id: str, token: int | None
    ) -> Signal | None:
        """A stored signal of the snapshot, decoded with its attempts (None: payload gone)."""
        ref = lease.ref_of(signal_id)
        stored = self._payloads(key, [ref]).get(ref) if ref is not None else None
        if stored is None:
            return None
        return decode_signal(signal_id, stored, token, lease.attempts.get(signal_id, 0))

    def _put_signal(self, key: str, signal_id: str, record: str, now: int) -> str:
        """Store a signal record before any lease write references it; returns its ref. A
        record that fits one item is one PutItem; a larger one is split into pieces, one item
        each, written with BatchWriteItem (the ref then ends in ``.<number of items>``). A
        resend rewrites identical items; pieces of a call that failed are reaped by their TTL,
        as nothing references them."""
        ref = _nonce()
        ttl = {"N": str(now // 1000 + self.retention_s)}
        pieces = _split(record)
        if len(pieces) == 1:
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
                        "ttl": ttl,
                    },
                },
            )
            return ref
        ref = f"{ref}{_SPLIT}{len(pieces)}"
        puts = [
            {
                "PutRequest": {
                    "Item": {
                        "pk": {"S": key},
                        "sk": {"S": sk},
                        "i": {"S": signal_id},
                        "r": {"S": piece},
                        "ttl": ttl,
                    }
                }
            }
            for sk, piece in zip(_item_sks(ref), pieces, strict=True)
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
                response = self._call(
                    "BatchWriteItem",
                    self.client.batch_write_item,
                    {"RequestItems": {self.table_name: pending}},
                )
                pending = response.get("UnprocessedItems", {}).get(self.table_name)
                if not pending:
                    break
            else:
                done = False
        return done

    def _delete_signals(self, key: str, refs: Sequence[str]) -> None:
        """Best-effort removal of payload items (a split payload's pieces too) nothing
        references any more: a failure leaves garbage that the items' own TTL removes, and must
        not fail the step that completed."""
        requests = [
            {"DeleteRequest": {"Key": {"pk": {"S": key}, "sk": {"S": sk}}}}
            for ref in dict.fromkeys(refs)
            for sk in _item_sks(ref)
        ]
        with contextlib.suppress(LeaseBackendError):
            self._write_items(requests)

    def _renew_payloads(self, key: str, refs: Sequence[str], now: int, *, pieces: bool) -> None:
        """Move the TTL of stored payload items to ``retention_s`` from ``now`` (only the pieces
        of a split payload, after its head, with ``pieces``). One conditional UpdateItem per
        item: one already gone (TTL) stays gone."""
        for ref in dict.fromkeys(refs):
            for sk in _item_sks(ref)[1 if pieces else 0 :]:
                with contextlib.suppress(_ConditionFailed):
                    self._update(
                        key,
                        "SET #ttl = :ttl",
                        "attribute_exists(#r)",
                        {":ttl": self._ttl(now)},
                        sk=sk,
                    )

    def _times(self) -> tuple[int, int]:
        now = int(self._clock())
        return now, now - self.clock_skew_ms

    def _ttl(self, until_ms: int) -> int:
        return until_ms // 1000 + self.retention_s

    def _shard(self, key: str) -> str:
        return f"orph#{zlib.crc32(key.encode('utf-8')) % self.orphan_shards}"

    def _dead_shard(self, key: str) -> str:
        """``gd``: the key's partition of the ``dead_letters`` index (as ``orph#`` for orphans)."""
        return f"dead#{zlib.crc32(key.encode('utf-8')) % self.orphan_shards}"

    # -- the contract ---------------------------------------------------------------------------

    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        old: _Lease | None = None
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            version = _nonce()
            try:
                if old is not None and old.in_flight and old.free_for(owner, now, cutoff):
                    attrs = self._take_over_in_flight(key, old, owner, ttl_ms, version, now, cutoff)
                else:
                    # [L3] free (or our own expired lease) with nothing in flight: a new grant
                    # in one blind write. No grant nonce ([G3] nonce=None). A dead owner's
                    # in-flight signals make it refuse: [G5] counts an attempt for each, which
                    # needs their ids (the refusal's ALL_OLD has them).
                    attrs = self._update(
                        key,
                        "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one,"
                        " #c = :true, #v = :v, #ttl = :ttl REMOVE #p, #pt, #w, #k, #kn",
                        f"{_FREE_FOR_ME} AND (attribute_not_exists(#f) OR size(#f) = :zero)",
                        {
                            ":me": owner,
                            ":exp": now + ttl_ms,
                            ":floor": now * 1000,
                            ":one": 1,
                            ":zero": 0,
                            ":true": True,
                            ":v": version,
                            ":ttl": self._ttl(now + ttl_ms),
                            ":now": now,
                            ":cutoff": cutoff,
                        },
                        returns="UPDATED_NEW",
                    )
                return LeaseResult(True, owner, _n(attrs, "t"))
            except _ConditionFailed as failed:
                old = failed.lease
            if old.version == version:  # a botocore resend of the grant above, applied earlier
                return LeaseResult(True, owner, old.token)
            if old.live_owner(owner, now):  # [L1] the owner again: same token, new deadline
                if old.token is not None and self._refresh(key, owner, old.token, ttl_ms):
                    return LeaseResult(True, owner, old.token)
                old = None
                continue
            if not old.free_for(owner, now, cutoff):  # [L2] refused, naming the holder
                return LeaseResult(False, old.holder(cutoff), old.token)
        raise LeaseBackendError(f"acquire of {key!r} did not settle under contention")

    def _take_over_in_flight(
        self,
        key: str,
        lease: _Lease,
        owner: str,
        ttl_ms: int,
        version: str,
        now: int,
        cutoff: int,
    ) -> dict[str, Any]:
        """[L3] with a dead owner's signals in flight: [G5] they go back to the head of the
        queue, each with one more attempt (the key stays in the orphan index), and [G3] the
        new grant. Conditional on the snapshot (its version; appends at the tail allowed)."""
        unchanged, values = lease.unchanged()
        attempts = dict(lease.attempts)
        for sid in lease.in_flight:
            attempts[sid] = attempts.get(sid, 0) + 1
        values.update(
            {
                ":me": owner,
                ":exp": now + ttl_ms,
                ":floor": now * 1000,
                ":one": 1,
                ":true": True,
                ":v": version,
                ":ttl": self._ttl(now + ttl_ms),
                ":now": now,
                ":cutoff": cutoff,
                ":empty": [],
                ":rq": list(lease.in_flight),
                ":rqn": list(lease.in_flight_refs),
                ":a": attempts,
            }
        )
        return self._update(
            key,
            "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one, #c = :true,"
            " #v = :v, #ttl = :ttl, #a = :a,"
            " #q = list_append(:rq, if_not_exists(#q, :empty)),"
            " #qn = list_append(:rqn, if_not_exists(#qn, :empty))"
            " REMOVE #p, #pt, #w, #k, #kn, #f, #fn",
            f"{unchanged} AND {_FREE_FOR_ME}",
            values,
            returns="UPDATED_NEW",
        )

    def _refresh(self, key: str, owner: str, token: int, ttl_ms: int) -> bool:
        """[L1] The current owner acquiring again: a new deadline, the same token."""
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
        version = _nonce()
        try:
            # [L4] with nothing in flight (a plain lease): [G7] free in one blind write. The
            # queue, if any, stays for the sweeper (gx = 0). See docs/dynamodb.md: a plain
            # owner's id is not added to the completed-id memory.
            self._update(
                key,
                "SET #p = :me, #pt = #t, #v = :v, #gx = :zero, #ttl = :ttl"
                " REMOVE #o, #c, #w, #k, #kn",
                f"{_LIVE_OWNER} AND (attribute_not_exists(#f) OR size(#f) = :zero)",
                {":me": owner, ":v": version, ":zero": 0, ":ttl": self._ttl(now), ":now": now},
            )
            return
        except _ConditionFailed as failed:
            lease = failed.lease
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, _ = self._times()
            if lease.version == version or not lease.live_owner(owner, now):
                return  # [L5] not the owner (or a resend of a release that was applied)
            # [L4] signals in flight: [G6] complete them, then [G7] free.
            outcome = self._complete(key, lease, owner, now, None, _Then("free"))
            if not isinstance(outcome, _Retry):
                return
            lease = outcome.lease or self._read(key)
        raise LeaseBackendError(f"release of {key!r} did not settle")

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        now, _ = self._times()
        try:
            # [R1] the holder (of exactly this grant) extends; [R2] never revives an expired one
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
        version = _nonce()
        try:
            # [T1] with nothing in flight: [G6] has nothing to complete; the grant ([G3],
            # nonce None, prev = from_owner) in one blind write.
            self._update(
                key,
                "SET #o = :to, #e = :exp, #t = #t + :one, #c = :true, #p = :me, #pt = #t,"
                " #v = :v, #ttl = :ttl REMOVE #w, #k, #kn",
                f"{_LIVE_OWNER} AND (attribute_not_exists(#f) OR size(#f) = :zero)",
                {
                    ":me": from_owner,
                    ":to": to_owner,
                    ":exp": now + ttl_ms,
                    ":one": 1,
                    ":zero": 0,
                    ":true": True,
                    ":v": version,
                    ":ttl": self._ttl(now + ttl_ms),
                    ":now": now,
                },
            )
            return True
        except _ConditionFailed as failed:
            lease = failed.lease
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            if lease.version == version:
                return True  # a botocore resend of the write above, applied earlier
            if lease.holder(cutoff) == to_owner and lease.previous == from_owner:
                return True  # [T3] a resend of a transfer that was applied
            if not lease.live_owner(from_owner, now):
                return False  # [T2]
            # [T1] signals in flight: [G6] complete them, then the grant.
            then = _Then("to", ttl_ms=ttl_ms, to_owner=to_owner)
            outcome = self._complete(key, lease, from_owner, now, None, then)
            if not isinstance(outcome, _Retry):
                return True
            lease = outcome.lease or self._read(key)
        raise LeaseBackendError(f"transfer of {key!r} did not settle")

    # -- the signal queue -----------------------------------------------------------------------

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        me = signal.id
        now, _ = self._times()
        # The payload item is written first, so no lease item ever references a payload that is
        # not there yet. It is not deleted here when the signal turns out to be a duplicate: a
        # write of this call may have been applied with its reply lost (or after botocore gave
        # up), so only the completing owner, which sees the lease item reference it, deletes
        # it; an unreferenced one is reaped by its TTL. The one exception is [Q8] below.
        ref = self._put_signal(key, me, record, now)
        nonce = _nonce()  # this call's grant nonce: [Q7] recognises its applied grants
        lease: _Lease | None = None
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            if lease is None:
                granted = self._grant_free(key, me, ref, ttl_ms, nonce, now, cutoff)
                if isinstance(granted, LeaseResult):
                    return granted
                lease = granted
            holder = lease.holder(cutoff)
            if holder is not None and lease.grant_nonce == nonce:
                # [Q7] a resend of this very call, which was applied (by the grant or adoption)
                return self._granted(key, lease, me)
            token = lease.token if holder is not None else None
            view = _done_view(lease.done, now)
            done = view.get(me)
            if (done is not None and done.ok) or me in lease.dead:
                return LeaseResult(False, holder, token)  # [Q5] completed or dead-lettered
            if self._forget(key, lease, me, view):
                lease = None  # a forgotten entry of ours blocked the conditions: again
                continue
            # A retry of an own event whose run failed resumes its count (model stored_new);
            # its done entry's tag makes the blind [Q1] / [Q2] writes refuse, so it is stored
            # by a write conditional on this snapshot instead.
            resume = done.attempts if done is not None else 0
            if holder == me:
                return LeaseResult(False, holder, token)  # [Q4] a second delivery of the owner
            known = me in lease.queue or me in lease.in_flight
            if holder is not None and known:
                # [Q3] queued (its place) or in flight (no place)
                position = lease.queue.index(me) + 1 if me in lease.queue else None
                return LeaseResult(False, holder, token, position=position)
            if holder is None and not lease.pending and not lease.halted:
                if not resume:
                    lease = None  # free and idle again: [Q1] once more
                    continue
                granted = self._grant_resumed(
                    key, lease, me, ref, ttl_ms, nonce, resume, now, cutoff
                )
                if isinstance(granted, LeaseResult):
                    return granted
                lease = granted
                continue
            if not known and len(lease.queue) >= max_queue:
                # [Q8] the queue is at its bound: refused, nothing stored. The refusal just seen
                # is the item as it stands and no write of this call references ``ref`` in it
                # (each was refused, or it would show here as [Q7] / [Q3] / [Q5]), so the
                # payload item is deleted: a refused forward leaves nothing behind.
                self._delete_signals(key, [ref])
                raise QueueFull(key, len(lease.queue), max_queue, holder)
            resumed = (lease, resume) if resume else None
            if holder is not None:
                appended = self._append(key, me, ref, cutoff, max_queue, resumed=resumed)  # [Q2]
                if isinstance(appended, LeaseResult):
                    return appended
                lease = appended
                continue
            if lease.halted:
                # [Q9] free and halted: queued behind the dead letter, nothing is granted
                if lease.in_flight:
                    queued = self._requeue_halted(key, lease, (me, ref), cutoff, resume)
                elif not known:
                    queued = self._append(
                        key, me, ref, cutoff, max_queue, halted=True, resumed=resumed
                    )
                else:  # already queued, nothing in flight: nothing to write
                    queued = LeaseResult(False, None, None, position=lease.queue.index(me) + 1)
                if isinstance(queued, LeaseResult):
                    return queued
                lease = queued
                continue
            # [Q6] orphaned: the dead owner's work first, this signal behind it, the head owns
            adopted = self._grant_orphan(
                key, lease, ttl_ms, True, (me, ref), nonce, now, cutoff, resume=resume
            )
            if isinstance(adopted, _Retry):
                lease = adopted.lease
                continue
            if adopted is None:  # every payload was gone (TTL) and ours too: again
                lease = None
                continue
            head, owner_signal = adopted
            if head == me:
                return LeaseResult(True, me, owner_signal.token, attempts=owner_signal.attempts)
            return LeaseResult(True, head, owner_signal.token, adopted=owner_signal)
        raise LeaseBackendError(f"acquire_or_enqueue on {key!r} did not settle")

    def _grant_free(
        self, key: str, me: str, ref: str, ttl_ms: int, nonce: str, now: int, cutoff: int
    ) -> LeaseResult | _Lease:
        """[Q1] free, nothing queued or in flight, not halted, ``me`` neither completed nor
        dead-lettered: ``me`` owns the key and stays in flight. Otherwise the item as it stands
        (ALL_OLD)."""
        try:
            attrs = self._update(
                key,
                "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one,"
                " #c = :true, #w = :w, #v = :v, #f = :f, #fn = :fn, #gp = :shard, #gx = :exp,"
                " #ttl = :ttl REMOVE #p, #pt, #k, #kn, #a",
                f"{_TAKEOVER} AND {_NOTHING_PENDING} AND attribute_not_exists(#h)"
                " AND NOT contains(#d, :me) AND NOT contains(#d, :tag)"
                " AND NOT contains(#x, :me)",
                {
                    ":me": me,
                    ":tag": _resume_tag(me),
                    ":exp": now + ttl_ms,
                    ":floor": now * 1000,
                    ":one": 1,
                    ":zero": 0,
                    ":true": True,
                    ":w": nonce,
                    ":v": _nonce(),
                    ":f": [me],
                    ":fn": [ref],
                    ":shard": self._shard(key),
                    ":ttl": self._ttl(now + ttl_ms),
                    ":cutoff": cutoff,
                },
                returns="UPDATED_NEW",
            )
        except _ConditionFailed as failed:
            return failed.lease
        return LeaseResult(True, me, _n(attrs, "t"))

    def _grant_resumed(
        self,
        key: str,
        lease: _Lease,
        me: str,
        ref: str,
        ttl_ms: int,
        nonce: str,
        attempts: int,
        now: int,
        cutoff: int,
    ) -> LeaseResult | _Lease:
        """[Q1] for a retry of an own event whose run failed (its done entry, seen in the
        snapshot ``lease``, carries ``attempts``): as :meth:`_grant_free`, and its stored
        attempts resume the count. Conditional on the snapshot (version, queue length);
        otherwise the item as it stands (ALL_OLD)."""
        version = _nonce()
        unchanged, values = lease.unchanged()
        queue_same, queue_values = lease.queue_unchanged()
        values.update(queue_values)
        values.update(
            {
                ":me": me,
                ":exp": now + ttl_ms,
                ":floor": now * 1000,
                ":one": 1,
                ":zero": 0,
                ":true": True,
                ":w": nonce,
                ":v": version,
                ":f": [me],
                ":fn": [ref],
                ":shard": self._shard(key),
                ":ttl": self._ttl(now + ttl_ms),
                ":cutoff": cutoff,
                ":a": {me: attempts},
            }
        )
        try:
            attrs = self._update(
                key,
                "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one,"
                " #c = :true, #w = :w, #v = :v, #f = :f, #fn = :fn, #gp = :shard, #gx = :exp,"
                " #ttl = :ttl, #a = :a REMOVE #p, #pt, #k, #kn",
                f"{unchanged} AND {queue_same} AND {_TAKEOVER} AND {_NOTHING_PENDING}"
                " AND attribute_not_exists(#h) AND NOT contains(#d, :me)"
                " AND NOT contains(#x, :me)",
                values,
                returns="UPDATED_NEW",
            )
        except _ConditionFailed as failed:
            if failed.lease.version == version:  # a botocore resend of this grant, applied
                return LeaseResult(True, me, failed.lease.token, attempts=attempts)
            return failed.lease
        return LeaseResult(True, me, _n(attrs, "t"), attempts=attempts)

    def _granted(self, key: str, lease: _Lease, me: str) -> LeaseResult:
        """The reply of a grant that is the current lease (model ``granted``)."""
        assert lease.owner is not None
        if lease.owner == me:
            return LeaseResult(True, me, lease.token, attempts=lease.attempts.get(me, 0))
        adopted = self._stored_signal(key, lease, lease.owner, lease.token)
        return LeaseResult(True, lease.owner, lease.token, adopted=adopted)

    def _forget(self, key: str, lease: _Lease, me: str, view: Mapping[str, _Done]) -> bool:
        """[G2] ``d`` still holds entries of ``me`` that do not deduplicate it (forgotten: past
        the window or the limits; or replaced by a later failed run): they would refuse the
        [Q1] / [Q2] conditions, so remove them (each conditional on still being at its
        index). True when something was removed."""
        done = view.get(me)
        if done is not None and done.ok:
            return False
        tag = _resume_tag(me)
        # a resume tag stays while the view's entry of me is a failed run with attempts
        live_tag = done is not None and done.attempts > 0
        at = [
            (i, ":me" if e.get("S") == me else ":tag")
            for i, e in enumerate(lease.done)
            if e.get("S") == me or (not live_tag and e.get("B") == tag)
        ][:32]
        if not at:
            return False
        names = ", ".join(f"#d[{i}]" for i, _ in at)
        # If d moved on (a prune) this refuses; the caller reads again either way.
        with contextlib.suppress(_ConditionFailed):
            self._update(
                key,
                f"REMOVE {names}",
                " AND ".join(f"#d[{i}] = {value}" for i, value in at),
                {":me": me, ":tag": tag},
            )
        return True

    def _append(
        self,
        key: str,
        me: str,
        ref: str,
        cutoff: int,
        max_queue: int,
        *,
        halted: bool = False,
        resumed: tuple[_Lease, int] | None = None,
    ) -> LeaseResult | _Lease:
        """[Q2] Queue ``me`` behind a live holder: one conditional write, so the holder cannot
        finish and leave between our check and the append (no lost wakeup), and the bound
        holds however many forwarders append at once ([Q8]). ``halted``: [Q9] queue ``me`` on
        a free, halted key with nothing in flight instead (the key stays out of the orphan
        index). Appends change neither the version nor the grant nonce. Otherwise the item
        as it stands (ALL_OLD).

        ``resumed`` (snapshot, attempts): ``me`` is a retry of an own event whose run failed,
        stored with that many attempts (``a``, which writers conditional on the version
        rewrite whole): then the append is conditional on the snapshot (version, queue
        length) and changes the version. A blind append refuses on its done entry's tag."""
        if halted:
            # [Q9] free (no holder, also not in limbo), halted, nothing in flight
            who = (
                "attribute_exists(#h) AND (attribute_not_exists(#o) OR #e < :cutoff)"
                " AND (attribute_not_exists(#f) OR size(#f) = :zero)"
            )
            index = ""
        else:
            who = "attribute_exists(#o) AND #o <> :me AND #e >= :cutoff"  # [Q2] held by another
            index = ", #gp = :shard, #gx = #e"
        values: dict[str, object] = {
            ":me": me,
            ":tag": _resume_tag(me),
            ":id": [me],
            ":ref": [ref],
            ":empty": [],
            ":zero": 0,
            ":max": max_queue,
            ":shard": self._shard(key),
            ":cutoff": cutoff,
        }
        # [Q3] [Q5] not stored, not remembered as completed, not dead-lettered; [Q8] the
        # queue below its bound
        condition = (
            f"{who} AND (attribute_not_exists(#q) OR size(#q) < :max)"
            " AND NOT contains(#q, :me) AND NOT contains(#f, :me)"
            " AND NOT contains(#d, :me) AND NOT contains(#x, :me)"
        )
        version: str | None = None
        if resumed is None:
            condition += " AND NOT contains(#d, :tag)"  # no attempts to resume
        else:
            snapshot, attempts = resumed
            unchanged, pinned = snapshot.unchanged()
            queue_same, queue_values = snapshot.queue_unchanged()
            values.update(pinned)
            values.update(queue_values)
            version = _nonce()
            values.update({":v": version, ":a": {**snapshot.attempts, me: attempts}})
            condition += f" AND {unchanged} AND {queue_same}"
            index += ", #a = :a, #v = :v"
        try:
            new = _Lease.parse(
                self._update(
                    key,
                    "SET #q = list_append(if_not_exists(#q, :empty), :id),"
                    f" #qn = list_append(if_not_exists(#qn, :empty), :ref){index}",
                    condition,
                    values,
                    returns="ALL_NEW",
                )
            )
        except _ConditionFailed as failed:
            if version is None or failed.lease.version != version:
                return failed.lease  # a resend of an applied append is recognised by the caller
            new = failed.lease  # a botocore resend of this very append, applied earlier
        position = new.queue.index(me) + 1 if me in new.queue else len(new.queue)
        if halted:
            return LeaseResult(False, None, None, position=position)
        return LeaseResult(False, new.owner, new.token, position=position)

    def _requeue_halted(
        self, key: str, lease: _Lease, extra: tuple[str, str], cutoff: int, resume: int = 0
    ) -> LeaseResult | _Lease:
        """[Q9] on a free, halted key with signals in flight (a plain owner took them and
        died): [G5] they go back to the head of the queue, each with one more attempt, and
        ``extra`` is queued behind everything unless stored already (with ``resume``
        attempts: a retry of an own event whose run failed); nothing is granted. One write
        conditional on the snapshot (version, queue length) and the key being free."""
        ids = list(lease.in_flight + lease.queue)
        refs = list(lease.in_flight_refs + lease.queue_refs)
        attempts = dict(lease.attempts)
        if extra[0] not in ids:
            ids.append(extra[0])
            refs.append(extra[1])
            if resume:
                attempts[extra[0]] = resume
        for sid in lease.in_flight:
            attempts[sid] = attempts.get(sid, 0) + 1
        unchanged, values = lease.unchanged()
        queue_same, queue_values = lease.queue_unchanged()
        values.update(queue_values)
        version = _nonce()
        values.update({":cutoff": cutoff, ":v": version, ":q": ids, ":qn": refs, ":a": attempts})
        try:
            self._update(
                key,
                "SET #q = :q, #qn = :qn, #a = :a, #v = :v REMOVE #f, #fn, #k, #kn",
                f"{unchanged} AND {queue_same} AND {_TAKEOVER} AND attribute_exists(#h)",
                values,
            )
        except _ConditionFailed as failed:
            if failed.lease.version != version:  # else: a resend of this write, applied
                return failed.lease
        return LeaseResult(False, None, None, position=ids.index(extra[0]) + 1)

    def _take(self, key: str, owner: str, limit: int, token: int | None = None) -> list[Signal]:
        taken_ids: list[str] = []
        taken_refs: list[str] = []
        attempts: Mapping[str, int] = {}
        tries = 0
        while len(taken_ids) < limit:
            tries += 1
            if tries > _OPTIMISTIC_ATTEMPTS + limit // _TAKE_BATCH:
                raise LeaseBackendError(f"take_signals on {key!r} did not settle")
            now, cutoff = self._times()
            lease = self._read(key)
            if not lease.live_grant(owner, now, token):
                if taken_ids:
                    break  # what we moved is in flight for us; adopt re-delivers it if we died
                raise LeaseLostError(key, owner, lease.holder(cutoff))  # [K3]
            attempts = lease.attempts
            n = min(limit - len(taken_ids), len(lease.queue), _TAKE_BATCH)
            if n == 0:
                break
            ids, refs = lease.queue[:n], lease.queue_refs[:n]
            nonce = _nonce()
            removes = ", ".join(f"#q[{i}], #qn[{i}]" for i in range(n))
            try:
                # [K1] the head of the queue moves to the owner's in-flight list
                self._update(
                    key,
                    f"REMOVE {removes} SET #f = list_append(if_not_exists(#f, :empty), :ids),"
                    " #fn = list_append(if_not_exists(#fn, :empty), :refs),"
                    " #k = :k, #kn = :n, #v = :v",
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
                        ":v": _nonce(),
                    },
                )
            except _ConditionFailed as failed:
                if failed.lease.take_nonce != nonce:  # [K2] else: our batch, applied earlier
                    continue
            taken_ids += ids
            taken_refs += refs
            if n == len(lease.queue):
                break  # we took all there was; later arrivals wait for the next call
        payloads = self._payloads(key, taken_refs)
        return [
            decode_signal(signal_id, payloads[ref], None, attempts.get(signal_id, 0))
            for signal_id, ref in zip(taken_ids, taken_refs, strict=True)
            if ref in payloads
        ]

    def _transfer_to_next(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        claim: bool,
        token: int | None = None,
        failure: Failure | None = None,
    ) -> Signal | None:
        lease: _Lease | None = None
        if failure is None:
            # Most owners finish with nothing queued, so first try [G6] + [N1] in one write,
            # conditional on the queue being empty (a forwarder that appended meanwhile makes
            # it fail: no lost wakeup). A refusal's ALL_OLD image is the consistent snapshot
            # the hand-off works from, so no separate read is needed.
            released = self._release_if_idle(key, owner, token)
            if released is None:
                return None
            lease = released
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            if lease is None:
                lease = self._read(key)
            if not lease.live_grant(owner, now, token):
                return self._not_holding(key, lease, owner, token, now, cutoff)
            outcome = self._complete(key, lease, owner, now, failure, _Then("next", ttl_ms, claim))
            if not isinstance(outcome, _Retry):
                return outcome if isinstance(outcome, Signal) else None
            lease = outcome.lease
        raise LeaseBackendError(f"transfer_to_next on {key!r} did not settle")

    def _not_holding(
        self, key: str, lease: _Lease, owner: str, token: int | None, now: int, cutoff: int
    ) -> Signal | None:
        """[N4] a resend of a step that was applied (we handed over or released last, or our
        grant is remembered as completed), else [N5] LeaseLostError."""
        if lease.previous == owner and (token is None or lease.prev_token == token):
            holder = lease.holder(cutoff)
            if holder is None:
                return None  # we released it
            if holder in lease.in_flight:  # the head our hand-off granted
                return self._stored_signal(key, lease, holder, lease.token)
            # moved by transfer_lease, not by our hand-off: the done memory decides
        done = _done_view(lease.done, now).get(owner)
        if token is not None and done is not None and done.token == token:
            return None
        raise LeaseLostError(key, owner, lease.holder(cutoff))

    def _release_if_idle(self, key: str, owner: str, token: int | None) -> _Lease | None:
        """[G6] + [N1] for a signal owner (its own signal heads the in-flight list) with nothing
        queued, in one write: every in-flight signal and the owner are remembered as completed
        (``d``), the key is freed and leaves the index. Returns None when released, else the
        item as it stands (ALL_OLD)."""
        now, _ = self._times()
        version = _nonce()
        try:
            old = self._update(
                key,
                "SET #p = :me, #pt = #t, #v = :v, #ttl = :ttl,"
                " #d = list_append(list_append(if_not_exists(#d, :empty), #f), :mark)"
                " REMOVE #o, #c, #w, #k, #kn, #f, #fn, #q, #qn, #gp, #gx, #a",
                f"{_LIVE_OWNER}{_same_grant(token)} AND #f[0] = :me"
                " AND (attribute_not_exists(#q) OR size(#q) = :zero)",
                {
                    ":me": owner,
                    ":now": now,
                    ":zero": 0,
                    ":v": version,
                    ":ttl": self._ttl(now),
                    ":grant": token,
                    ":empty": [],
                    ":mark": [_marker(now, token or 0, True)],
                },
                returns="ALL_OLD",
            )
        except _ConditionFailed as failed:
            if failed.lease.version == version:  # a botocore resend of this very release
                return None
            return failed.lease
        completed = _strings(old, "fn")
        if completed:
            self._delete_signals(key, completed)
        done = list(old["d"]["L"]) if "d" in old else []
        done += [{"S": sid} for sid in _strings(old, "f")]
        done.append({"N": str(_marker(now, token or 0, True))})
        self._prune(key, done, now)
        return None

    def _prune(self, key: str, done: Sequence[Mapping[str, Any]], now: int) -> None:
        """Drop forgotten batches from the head of ``d`` once enough piled up ([G2]): one
        write, conditional on the last removed element (a unique marker) being where it was.
        Best effort: a failure only leaves them for the next completion."""
        cut = _prunable(done, _done_view(done, now))
        if cut < _PRUNE_MIN:
            return
        names = ", ".join(f"#d[{i}]" for i in range(cut))
        with contextlib.suppress(_ConditionFailed, LeaseBackendError):
            self._update(
                key,
                f"REMOVE {names}",
                f"#d[{cut - 1}] = :m",
                {":m": int(done[cut - 1]["N"])},
            )

    def _complete(
        self,
        key: str,
        lease: _Lease,
        owner: str,
        now: int,
        failure: Failure | None,
        then: _Then,
    ) -> Signal | bool | _Retry | None:
        """[G6] complete the owner's in-flight signals, then ``then``: one write conditional on
        the snapshot ``lease`` (the live grant, its version; appends allowed for).

        Returns the next owner's signal ([N2] [N3]), None ([N1]), True ([L4] [T1]), or a
        :class:`_Retry` with the item as it stands."""
        assert lease.token is not None
        token = lease.token
        attempts = dict(lease.attempts)
        done_ids: list[str] = []
        back: list[tuple[str, str]] = []
        dead: list[tuple[str, str, int]] = []
        drop: list[str] = []
        own_attempts = 0
        for sid, ref in zip(lease.in_flight, lease.in_flight_refs, strict=False):
            attempts.pop(sid, None)
            if failure is None:
                done_ids.append(sid)
                drop.append(ref)
                continue
            count = lease.attempts.get(sid, 0) + 1
            if count >= failure.max_attempts:
                dead.append((sid, ref, count))  # [G6] dead-lettered (the owner's own too)
            elif sid != owner or failure.requeue_owner:
                attempts[sid] = count  # [G6] back to the head of the queue
                back.append((sid, ref))
            else:
                # the platform retries the owner's own event; its done entry carries the
                # count, which that retry resumes ([Q1] [Q2] [Q6] [Q9])
                drop.append(ref)
                own_attempts = count
        # transfer_to_next's own step is remembered either way (a failed one is not
        # deduplicated, so it is nested: [G6] / [N4] read it, the dedupe conditions do not
        # match it; with a count, its resume tag follows it: the blind [Q1] / [Q2] writes
        # refuse on that). The contract's release and transfer ([L4] [T1]) do not remember
        # their owner (model ``mark_owner=False``: a plain owner is no signal).
        batch: list[Any] = list(done_ids)
        if then.kind == "next" and owner not in done_ids:
            batch.append(owner)
        if failure is not None:
            batch = [[owner, own_attempts], _resume_tag(owner)] if own_attempts else [[owner]]
        mark = _marker(now, token, failure is None)
        version = _nonce()
        unchanged, values = lease.unchanged()
        values.update({":me": owner, ":now": now, ":tok": token, ":v": version, ":empty": []})
        sets = ["#p = :me", "#pt = :tok", "#v = :v"]
        if batch:
            sets.append("#d = list_append(if_not_exists(#d, :empty), :done)")
            values[":done"] = [*batch, mark]
        removes = ["#k", "#kn", "#w"]
        condition = f"{_LIVE_OWNER} AND #t = :tok AND {unchanged}"
        if dead:
            for _, ref, count in dead:
                self._mark_dead(key, ref, failure.error if failure else "", count, now)
            sets += [
                "#x = list_append(if_not_exists(#x, :empty), :xid)",
                "#xn = list_append(if_not_exists(#xn, :empty), :xref)",
            ]
            values[":xid"] = [sid for sid, _, _ in dead]
            values[":xref"] = [ref for _, ref, _ in dead]
            # the key holds dead letters: it is in the dead_letters index until a redrive
            # ([V1]) moves the last of them
            sets.append("#gd = :dshard")
            values[":dshard"] = self._dead_shard(key)
        halting = bool(dead) and failure is not None and failure.halt
        if halting:
            sets.append("#h = :true")  # [G6] dead-lettered under on_poison="halt"
            values[":true"] = True
        result: Signal | bool | None
        if then.kind == "free":  # [L4] then [G7]: the queue stays, for the sweeper
            sets += ["#gx = :zero", "#ttl = :ttl"]
            removes += ["#o", "#c", "#f", "#fn"]
            values.update({":zero": 0, ":ttl": self._ttl(now)})
            result = True
        elif then.kind == "to":  # [T1] the grant ([G3]) to to_owner, prev = owner
            sets += ["#o = :to", "#e = :exp", "#t = :new", "#c = :true", "#ttl = :ttl"]
            removes += ["#f", "#fn"]
            values.update(
                {
                    ":to": then.to_owner,
                    ":exp": now + then.ttl_ms,
                    ":new": token + 1,
                    ":true": True,
                    ":ttl": self._ttl(now + then.ttl_ms),
                }
            )
            result = True
        elif lease.halted or halting:
            # [N1] halted: released with the queue kept (the retried signals at its head, in
            # order); appends since the snapshot stay behind them. A halted key leaves the
            # orphan index: nothing of it is adopted until a redrive ([D4] [V1]).
            if back:
                _put_at_head(sets, values, back)
            sets.append("#ttl = :ttl")
            removes += ["#o", "#c", "#f", "#fn", "#gp", "#gx"]
            values[":ttl"] = self._ttl(now)
            result = None
        else:
            ids = [sid for sid, _ in back] + list(lease.queue)
            refs = [ref for _, ref in back] + list(lease.queue_refs)
            head_at, stored = self._first_payload(key, refs)
            for sid in ids[: head_at if stored is not None else len(ids)]:
                attempts.pop(sid, None)  # payload gone (TTL): dropped
            if stored is None:
                # [N1] nothing (with a payload) queued: released. Conditional on no append
                # since the snapshot, whose signal would otherwise be dropped with the queue.
                queue_same, queue_values = lease.queue_unchanged()
                condition += f" AND {queue_same}"
                values.update(queue_values)
                sets.append("#ttl = :ttl")
                removes += ["#o", "#c", "#f", "#fn", "#q", "#qn", "#gp", "#gx"]
                values[":ttl"] = self._ttl(now)
                result = None
            else:
                # [N2] / [N3] the head (a retried signal first) owns the key, claimed by the
                # caller or left to a claim; [G3] nonce None, prev = owner, prev_token = token
                head, new_token = ids[head_at], token + 1
                if head_at < len(back):
                    rest = back[head_at + 1 :]
                    if rest:
                        _put_at_head(sets, values, rest)
                else:
                    upto = head_at - len(back)
                    removes += [f"#q[{i}], #qn[{i}]" for i in range(upto + 1)]
                sets += [
                    "#o = :next",
                    "#e = :exp",
                    "#t = :new",
                    "#c = :claimed",
                    "#f = :f",
                    "#fn = :fn",
                    "#gp = :shard",
                    "#gx = :exp",
                    "#ttl = :ttl",
                ]
                values.update(
                    {
                        ":next": head,
                        ":exp": now + then.ttl_ms,
                        ":new": new_token,
                        ":claimed": then.claim,
                        ":f": [head],
                        ":fn": [refs[head_at]],
                        ":shard": self._shard(key),
                        ":ttl": self._ttl(now + then.ttl_ms),
                    }
                )
                result = decode_signal(head, stored, new_token, attempts.get(head, 0))
        if attempts:
            sets.append("#a = :a")
            values[":a"] = attempts
        else:
            removes.append("#a")
        try:
            self._update(
                key, f"SET {', '.join(sets)} REMOVE {', '.join(removes)}", condition, values
            )
        except _ConditionFailed as failed:
            if failed.lease.version != version:  # else: a resend of this write, applied
                return _Retry(failed.lease)
        if drop:
            self._delete_signals(key, drop)
        if batch:
            self._prune(key, [*lease.done, *(_av(e) for e in batch), {"N": str(mark)}], now)
        return result

    def _mark_dead(self, key: str, ref: str, error: str, attempts: int, now: int) -> None:
        """[G6] A dead letter's error, attempts and time live on its payload item (written
        before the lease item lists it, so a listed dead letter always has them); the item is
        kept as long as the lease item."""
        # A payload already gone (TTL) refuses: the dead letter is listed without it.
        with contextlib.suppress(_ConditionFailed):
            self._update(
                key,
                "SET #de = :err, #da = :att, #df = :at, #ttl = :ttl",
                "attribute_exists(#r)",
                {":err": error, ":att": attempts, ":at": now, ":ttl": self._ttl(now)},
                sk=SIGNAL_SK_PREFIX + ref,
            )
        # the other pieces of a split payload are kept as long as its head
        self._renew_payloads(key, [ref], now, pieces=True)

    def _first_payload(self, key: str, refs: Sequence[str]) -> tuple[int, str | None]:
        """Index and record of the first ref whose payload item still exists (normally the
        first one; payloads only vanish through their TTL)."""
        start = 0
        for size in _growing_chunks():
            chunk = refs[start : start + size]
            if not chunk:
                return 0, None
            if size > 1:
                # past a payload that is gone: find which heads are left (keys only, not the
                # records, which may be megabytes each), then read those whole in order
                heads = self._get_items(key, [SIGNAL_SK_PREFIX + ref for ref in chunk], ["sk"])
                for offset, ref in enumerate(chunk):
                    if SIGNAL_SK_PREFIX + ref in heads:
                        stored = self._payloads(key, [ref]).get(ref)
                        if stored is not None:
                            return start + offset, stored
            else:
                found = self._payloads(key, chunk)
                if chunk[0] in found:
                    return start, found[chunk[0]]
            start += len(chunk)
        return 0, None  # pragma: no cover - _growing_chunks never ends

    def _grant_orphan(
        self,
        key: str,
        lease: _Lease,
        ttl_ms: int,
        claim: bool,
        extra: tuple[str, str] | None,
        nonce: str,
        now: int,
        cutoff: int,
        *,
        envelope: tuple[str, int] | None = None,
        resume: int = 0,
    ) -> tuple[str, Signal] | _Retry | None:
        """[G5] the owner died (or released) with work pending: what it had in flight goes back
        to the head, each with one more attempt, ``extra`` is queued behind everything ([Q6]),
        and [G4] the head owns the key under grant nonce ``nonce`` ([Q6] / [D1] / [C4]). One
        write, conditional on the snapshot (version, queue length), the key still being free
        and not halted. ``envelope`` (id, token): [C4], the grant of that envelope, whose id
        heads the in-flight list, is run again; None (no write) if its payload is gone.
        ``resume``: ``extra``, when stored anew, is a retry of an own event whose run failed
        and resumes that many attempts. Returns (head, its signal), None when no payload is
        left, or a retry."""
        ids = list(lease.in_flight + lease.queue)
        refs = list(lease.in_flight_refs + lease.queue_refs)
        resumed: dict[str, int] = {}
        if extra is not None and extra[0] not in ids:
            ids.append(extra[0])
            refs.append(extra[1])
            if resume:
                resumed[extra[0]] = resume
        head_at, stored = self._first_payload(key, refs)
        if envelope is not None and (stored is None or head_at != 0):
            return None  # [C3] the envelope's signal is no longer stored (its payload's TTL)
        version = _nonce()
        unchanged, values = lease.unchanged()
        queue_same, queue_values = lease.queue_unchanged()
        values.update(queue_values)
        values.update({":cutoff": cutoff, ":v": version, ":w": nonce})
        # [D4] [Q9] [C4] a halted key is never granted from its queue (the version pins h too)
        condition = f"{unchanged} AND {queue_same} AND {_TAKEOVER} AND attribute_not_exists(#h)"
        if envelope is not None:
            # [C4] the envelope's grant: its token is the last issued, its id heads in flight
            condition += " AND #t = :tok AND #f[0] = :env"
            values.update({":env": envelope[0], ":tok": envelope[1]})
        if stored is None:
            try:
                self._update(
                    key,
                    "SET #v = :v REMOVE #q, #qn, #f, #fn, #gp, #gx, #a",
                    condition,
                    values,
                )
            except _ConditionFailed as failed:
                return None if failed.lease.version == version else _Retry(failed.lease)
            return None
        head = ids[head_at]
        rest_ids, rest_refs = ids[head_at + 1 :], refs[head_at + 1 :]
        token = lease.token + 1 if lease.token is not None else now * 1000 + 1
        attempts = {
            sid: n for sid, n in {**lease.attempts, **resumed}.items() if sid in ids[head_at:]
        }
        for sid in lease.in_flight:  # [G5] a run that never finished counts
            if sid in ids[head_at:]:
                attempts[sid] = attempts.get(sid, 0) + 1
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
                ":a": attempts,
            }
        )
        queue = ", #q = :q, #qn = :qn" if rest_ids else ""
        drop = "" if rest_ids else ", #q, #qn"
        keep_attempts = ", #a = :a" if attempts else ""
        drop_attempts = "" if attempts else ", #a"
        signal = decode_signal(head, stored, token, attempts.get(head, 0))
        try:
            self._update(
                key,
                "SET #o = :next, #e = :exp, #t = :new, #c = :claimed, #w = :w, #v = :v,"
                f" #f = :f, #fn = :fn, #gp = :shard, #gx = :exp, #ttl = :ttl{queue}"
                f"{keep_attempts} REMOVE #p, #pt, #k, #kn{drop}{drop_attempts}",
                condition,
                values,
            )
        except _ConditionFailed as failed:
            old = failed.lease
            if old.version == version:
                return head, signal  # a botocore resend of this write, applied earlier
            if old.grant_nonce == nonce and old.holder(cutoff) is not None and old.owner:
                # [Q7] / [D3] applied earlier, then another writer (an append) changed the
                # item: the grant is still ours
                again = self._stored_signal(key, old, old.owner, old.token)
                if again is not None:
                    return old.owner, again
            return _Retry(old)
        return head, signal

    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        nonce = _nonce()  # this claim's grant nonce: a resend of its write finds it in ``w``
        lease: _Lease | None = None
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            if lease is None:
                lease = self._read(key)
            if lease.live_owner(owner, now) and lease.grant_nonce == nonce:
                # [C1] / [C4] again: a resend of this claim's write, which was applied
                return self._stored_signal(key, lease, owner, lease.token)
            if (
                lease.holder(cutoff) is None
                and lease.token == token
                and lease.in_flight[:1] == (owner,)
                and not lease.halted
            ):
                # [C4] the grant's lease ran out with its signal still in flight: [G5] (one
                # more attempt) and [G4] it owns the key again, claimed, under a new token
                again = self._grant_orphan(
                    key, lease, ttl_ms, True, None, nonce, now, cutoff, envelope=(owner, token)
                )
                if isinstance(again, _Retry):
                    lease = again.lease
                    continue
                return again[1] if again is not None else None
            if not lease.live_owner(owner, now) or lease.token != token:
                return None  # [C3] stale, forged, or the grant moved on
            ref = lease.ref_of(owner)
            if ref is None:
                return None  # [C3] not a stored signal's grant
            if lease.claimed:
                return None  # [C2] claimed before by another call (a duplicate envelope)
            stored = self._payloads(key, [ref]).get(ref)
            if stored is None:
                return None
            try:
                # [C1] claimed once, under this call's grant nonce; the deadline is refreshed
                self._update(
                    key,
                    "SET #c = :true, #e = :exp, #ttl = :ttl, #w = :w, #v = :v",
                    f"{_LIVE_OWNER} AND #t = :tok AND #c = :false",
                    {
                        ":me": owner,
                        ":now": now,
                        ":tok": token,
                        ":true": True,
                        ":false": False,
                        ":exp": now + ttl_ms,
                        ":ttl": self._ttl(now + ttl_ms),
                        ":w": nonce,
                        ":v": _nonce(),
                    },
                )
            except _ConditionFailed as failed:
                if failed.lease.grant_nonce != nonce:
                    lease = failed.lease  # claimed by another call, or it moved: look again
                    continue
            return decode_signal(owner, stored, token, lease.attempts.get(owner, 0))
        raise LeaseBackendError(f"claim of {key!r} did not settle")

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
        return self._index_keys(ORPHAN_INDEX, "#gp = :g AND #gx < :cutoff", shard, cutoff)

    def _index_keys(
        self, index: str, condition: str, shard: str, cutoff: int | None = None
    ) -> Iterator[str]:
        """The keys (``pk``) in one shard of a sparse index (``orphans`` or ``dead_letters``),
        page by page: the only Query this provider makes, and never a Scan."""
        names = {n: _NAMES[n] for n in set(_NAME_RE.findall(condition))}
        values: dict[str, Any] = {":g": {"S": shard}}
        if cutoff is not None:
            values[":cutoff"] = {"N": str(cutoff)}
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": index,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
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
        nonce = _nonce()  # this adoption's grant nonce: [D3] recognises it when resent
        lease: _Lease | None = None
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, cutoff = self._times()
            if lease is None:
                lease = self._read(key)
            if not lease.exists or not lease.indexed:
                return None
            holder = lease.holder(cutoff)
            if holder is not None:
                if lease.grant_nonce == nonce:  # [D3] a resend of this adoption
                    return self._stored_signal(key, lease, holder, lease.token)
                if lease.index_at is None or lease.index_at < cutoff:
                    # [D2] The owner renewed since it was indexed: move its entry to its deadline.
                    try:
                        self._update(
                            key,
                            "SET #gx = #e",
                            "attribute_exists(#gp) AND attribute_exists(#o) AND #e >= :cutoff",
                            {":cutoff": cutoff},
                        )
                    except _ConditionFailed:
                        lease = None
                        continue
                return None  # [D2] the owner is alive
            if lease.halted:
                # [D4] halted: nothing is adopted until a redrive, and the key leaves the
                # orphan index (an append or release under a plain owner may have put it
                # back); a redrive ([V1]) indexes it again. Index moves keep the version.
                with contextlib.suppress(_ConditionFailed):
                    self._update(
                        key,
                        "REMOVE #gp, #gx",
                        "attribute_exists(#h) AND attribute_exists(#gp)",
                        {},
                    )
                return None
            # [D1] the head of the dead owner's work owns the key
            result = self._grant_orphan(key, lease, ttl_ms, claim, None, nonce, now, cutoff)
            if not isinstance(result, _Retry):
                return result[1] if result is not None else None
            lease = result.lease
        raise LeaseBackendError(f"adopting {key!r} did not settle")

    def _redrive(self, key: str, ids: tuple[str, ...] | None) -> int:
        lease: _Lease | None = None
        renewed: set[str] = set()
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            now, _ = self._times()
            if lease is None:
                lease = self._read(key)
            moved = [i for i, sid in enumerate(lease.dead) if ids is None or sid in ids]
            if not moved:
                return 0  # [V2] nothing matches (also a resend of an applied redrive)
            kept = [i for i in range(len(lease.dead)) if i not in moved]
            moved_ids = [lease.dead[i] for i in moved]
            moved_refs = [lease.dead_refs[i] for i in moved if i < len(lease.dead_refs)]
            # Their payload items expire retention_s after they failed: before the queue lists
            # them again, they get a full retention_s from now (once per call; an item already
            # gone stays gone and the signal is dropped when it reaches the head, [N1]).
            self._renew_payloads(
                key, [ref for ref in moved_refs if ref not in renewed], now, pieces=False
            )
            renewed.update(moved_refs)
            version = _nonce()
            unchanged, values = lease.unchanged()
            values.update(
                {
                    ":v": version,
                    ":empty": [],
                    ":rq": moved_ids,
                    ":rqn": moved_refs,
                    ":shard": self._shard(key),
                    # a free key's work is orphaned at once; a live owner's is indexed at its
                    # deadline (renewals since then are met by the sweep, as for [Q2])
                    ":gx": lease.expiry if lease.owner is not None else 0,
                    ":ttl": self._ttl(max(now, lease.expiry)),
                }
            )
            # [V1] the dead letters go to the head of the queue in the order they died (with
            # no attempts counted: ``a`` holds none for them), appends since the snapshot
            # stay behind; the key is no longer halted and is in the orphan index, so the next
            # event ([Q6]) or the sweeper ([D1]) runs them when it is free.
            sets = [
                "#q = list_append(:rq, if_not_exists(#q, :empty))",
                "#qn = list_append(:rqn, if_not_exists(#qn, :empty))",
                "#v = :v",
                "#gp = :shard",
                "#gx = :gx",
                "#ttl = :ttl",
            ]
            removes = ["#h"]
            if kept:
                sets += ["#x = :x", "#xn = :xn"]
                values[":x"] = [lease.dead[i] for i in kept]
                values[":xn"] = [lease.dead_refs[i] for i in kept if i < len(lease.dead_refs)]
            else:
                removes += ["#x", "#xn", "#gd"]  # no dead letters left: out of that index
            try:
                self._update(
                    key,
                    f"SET {', '.join(sets)} REMOVE {', '.join(removes)}",
                    unchanged,
                    values,
                )
            except _ConditionFailed as failed:
                # Another writer, or a resend of this write that was applied: look again (a
                # resend then finds nothing to move, [V2], as the model answers it).
                lease = failed.lease
                continue
            return len(moved)
        raise LeaseBackendError(f"redrive of {key!r} did not settle")

    def _dead_letter_keys(self, limit: int) -> list[str]:
        """Keys with dead letters, from the sparse ``dead_letters`` index (``gd`` is set by the
        write that dead-letters a signal and removed by the redrive that moves the last one):
        one Query per shard and page, never a Scan. The index is eventually consistent: a key
        redriven a moment ago may still be listed."""
        found: list[str] = []
        for shard in range(self.orphan_shards):
            for key in self._index_keys(DEAD_LETTER_INDEX, "#gd = :g", f"dead#{shard}"):
                if key not in found:
                    found.append(key)
                if len(found) >= limit:
                    return sorted(found)
        return sorted(found)

    def _inspect(self, key: str) -> KeyState:
        now, cutoff = self._times()
        lease = self._read(key)
        items = self._payload_items(
            key, list(lease.queue_refs + lease.dead_refs), ("de", "da", "df")
        )
        holder = lease.holder(cutoff)
        dead: list[DeadLetter] = []
        for signal_id, ref in zip(lease.dead, lease.dead_refs, strict=False):
            item = items.get(ref)
            if item is None:
                continue
            signal = decode_signal(signal_id, str(item["r"]["S"]))
            dead.append(
                DeadLetter(
                    id=signal_id,
                    payload=signal.payload,
                    attempts=_n(item, "da") or 0,
                    error=_s(item, "de") or "",
                    enqueued_at_ms=signal.enqueued_at_ms,
                    failed_at_ms=_n(item, "df") or 0,
                )
            )
        return KeyState(
            key=key,
            owner=holder,
            token=lease.token if holder is not None else None,
            remaining_ms=max(lease.expiry - now, 0) if holder is not None else None,
            queued=tuple(
                decode_signal(
                    signal_id, str(items[ref]["r"]["S"]), None, lease.attempts.get(signal_id, 0)
                )
                for signal_id, ref in zip(lease.queue, lease.queue_refs, strict=True)
                if ref in items
            ),
            in_flight=lease.in_flight,
            dead_letters=tuple(dead),
            halted=lease.halted,
        )


def _put_at_head(sets: list[str], values: dict[str, Any], items: Sequence[tuple[str, str]]) -> None:
    """[G5]/[G6] ``(id, payload ref)`` pairs go to the head of the queue, in order; appends
    since the snapshot stay behind them (``values`` must hold ``:empty``)."""
    sets += [
        "#q = list_append(:rq, if_not_exists(#q, :empty))",
        "#qn = list_append(:rqn, if_not_exists(#qn, :empty))",
    ]
    values[":rq"] = [sid for sid, _ in items]
    values[":rqn"] = [ref for _, ref in items]


def _same_grant(token: int | None) -> str:
    """The condition that limits an owner-side write to the grant with ``token`` (``:grant``)."""
    return "" if token is None else " AND #t = :grant"


def _split(record: str) -> list[str]:
    """A signal record as the ``r`` values of its items: itself when it fits one item, else
    pieces of at most ITEM_RECORD_BYTES UTF-8 bytes each, cut between characters."""
    data = record.encode("utf-8")
    if len(data) <= ITEM_RECORD_BYTES:
        return [record]
    pieces: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + ITEM_RECORD_BYTES, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # inside a character: back off
            end -= 1
        pieces.append(data[start:end].decode("utf-8"))
        start = end
    return pieces


_MAX_ITEMS = DYNAMODB_MAX_PAYLOAD_BYTES // (ITEM_RECORD_BYTES - 4) + 2


def _item_sks(ref: str) -> list[str]:
    """The sort keys of a payload's items: ``sig#<ref>`` (the head, with the first piece and
    a dead letter's attributes), then ``sig#<ref>#1`` ... for the other pieces of a split one
    (whose ref ends in ``.<number of items>``)."""
    head = SIGNAL_SK_PREFIX + ref
    _, split, count = ref.rpartition(_SPLIT)
    if not split or not count.isdigit() or not 2 <= int(count) <= _MAX_ITEMS:
        return [head]
    return [head, *(f"{head}{_PIECE}{i}" for i in range(1, int(count)))]


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
