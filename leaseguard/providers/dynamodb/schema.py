"""The table's layout: key and attribute names, sizes, and the lease item as read.

The item layout itself is described in :mod:`leaseguard.providers.dynamodb`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .expressions import QUEUE_EMPTY, QUEUE_SIZE_IS, VERSION_ABSENT, VERSION_IS

LEASE_SK = "lease"
SIGNAL_SK_PREFIX = "sig#"
ORPHAN_INDEX = "orphans"
DEAD_LETTER_INDEX = "dead_letters"
DEFAULT_RETENTION_S = 7 * 86_400
DEFAULT_ORPHAN_SHARDS = 8
DEFAULT_MAX_ATTEMPTS = 4
# The takeover margin (``e + clock_skew_ms < now``) when none is configured: Lambda hosts are
# NTP-synced to milliseconds. Defined here, the provider being its only user, so that this
# package never imports leaseguard.config (which builds the provider).
DEFAULT_CLOCK_SKEW_MS = 1_000
# DynamoDB's item limit is 400 KB; the key, the signal id, a dead letter's error and the
# attribute names of a payload item take at most a few KiB of it. A signal record (its payload
# plus the ``{"at":...,"p":...}`` envelope) of up to this many UTF-8 bytes is one item; a larger
# one is split into pieces of at most this size, one item each.
ITEM_RECORD_BYTES = 400 * 1024 - 8 * 1024 + 64
# The largest max_payload_bytes (the base providers' ceiling): 168 items, 7 BatchWriteItem.
DYNAMODB_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
# Separates a split payload's random ref from its item count (``<nonce>.<n>``) and a piece's
# index from the ref in its sort key (``sig#<nonce>.<n>#<i>``).
SPLIT = "."
_PIECE = "#"
_MAX_ITEMS = DYNAMODB_MAX_PAYLOAD_BYTES // (ITEM_RECORD_BYTES - 4) + 2
# How often one step re-reads and retries when another writer changed the item in between.
OPTIMISTIC_ATTEMPTS = 32

# A payload ref names either payload items (a random hex nonce, ``.<n>`` when split) or, for a
# record small enough, the record itself: INLINE followed by it, in the lease item's ``qn`` /
# ``fn``. The record then travels with its ref through every write that moves refs (take,
# hand-off, requeue, adoption) and leaves with the REMOVE of ``fn`` that completes it, so the
# uncontended path needs neither a payload write nor its deletion. The prefix starts no nonce.
INLINE = "="
# Records go inline only while the lease item stays within one write unit, so that inlining
# never makes a write of the lease item (a renewal above all) cost more than it would without.
INLINE_ITEM_BYTES = 1024
# A blind grant ([Q1]) does not see the item it writes: what it writes (key, owner and the
# in-flight entry besides) is about this much, and this much more is left for what it cannot
# see (entries ``d`` keeps of recent completions, about 60 bytes each with request ids).
_GRANT_WRITES_BYTES = 112
_GRANT_UNSEEN_BYTES = 160
# What the owner's first renewal adds to the item (``es`` and ``et``, see EXTEND_UPDATE): left
# free by every inline judgement, so that no renewal makes the item cross INLINE_ITEM_BYTES.
_EXTEND_BYTES = 24
# What storing one more entry adds besides its id and ref (list overheads, ``gp``/``gx``).
_ENTRY_BYTES = 32
# DynamoDB refuses a write that would make an item larger than ITEM_LIMIT_BYTES. A forward is
# the only write that grows the lease item at a caller's discretion; every other write moves
# entries (queue -> in flight -> done or dead letters) or adds what the protocol cannot refuse:
# attempt counts (``a``: one per stored signal, after a failure or a crash) and completed ids
# (``d``: at most done.DONE_STORED_BYTES after any completion, forgotten entries included;
# DONE_RESERVE_BYTES leaves room above that for a blind release's append). So a
# forward is refused ([Q8]) unless the item, with the entry and the attempt count it may later
# get, still leaves room for those, and ITEM_MARGIN_BYTES for forwards racing with it (each
# judges the snapshot it read) and the small fields. Without it, a key could reach the limit
# and then refuse its owner's completion and every adoption: stuck, its queue lost to the TTL.
ITEM_LIMIT_BYTES = 400 * 1024
ITEM_MARGIN_BYTES = 48 * 1024
DONE_RESERVE_BYTES = 128 * 1024
_ATTEMPT_BYTES = 8  # an ``a`` entry besides its id: the count and the map's overheads

# Every attribute name goes through ExpressionAttributeNames (``owner``, ``ttl`` and many short
# words are reserved); requests include only the names their expressions use.
NAMES = {
    f"#{name}": name
    for name in (
        "pk",
        "sk",
        "o",
        "e",
        "es",
        "et",
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
        "rv",
        "rn",
        "ra",
    )
}


def attribute_value(value: object) -> dict[str, Any]:
    """A Python value as a DynamoDB attribute value (only the shapes this provider stores)."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, bytes):
        return {"B": value}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, (list, tuple)):
        return {"L": [attribute_value(v) for v in value]}
    if isinstance(value, dict):
        return {"M": {str(k): attribute_value(v) for k, v in value.items()}}
    raise TypeError(f"cannot store {type(value).__name__}")


def string_of(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value["S"])


def number_of(item: Mapping[str, Any], name: str) -> int | None:
    value = item.get(name)
    return None if value is None else int(value["N"])


def strings_of(item: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = item.get(name)
    return () if value is None else tuple(str(v["S"]) for v in value["L"])


@dataclass(frozen=True)
class Lease:
    """The lease item as read (or as returned by ``ALL_OLD``); absent attributes are empty.

    ``grant_nonce`` (``w``) names the call that made or claimed the current grant and is written
    only by those calls ([Q1] [Q6] [D1] [C1]); ``version`` (``v``) is a fresh nonce on every write
    except appends, renewals and index moves, and is what snapshot-based writes are conditional
    on (appends only add at the tail of ``q``, which those writes allow for explicitly).
    ``size`` is the item's size by DynamoDB's rules, which the inline budget is judged by.
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
    redrive_nonce: str | None = None  # rv, rn, ra: the last redrive that moved something [V3]
    redrive_moved: int = 0
    redrive_at: int = 0
    size: int = 0
    done_size: int = 0
    unclaimed: bool = False  # ``c`` written false: a hand-off or adoption nobody claimed yet

    @classmethod
    def parse(cls, item: Mapping[str, Any] | None) -> Lease:
        if not item:
            return cls(exists=False)
        claimed = item.get("c")
        attempts = item.get("a")
        done = item.get("d")
        return cls(
            exists=True,
            owner=string_of(item, "o"),
            expiry=number_of(item, "e") or 0,
            token=number_of(item, "t"),
            claimed=bool(claimed["BOOL"]) if claimed is not None else False,
            previous=string_of(item, "p"),
            prev_token=number_of(item, "pt"),
            grant_nonce=string_of(item, "w"),
            version=string_of(item, "v"),
            take_nonce=string_of(item, "k"),
            queue=strings_of(item, "q"),
            queue_refs=strings_of(item, "qn"),
            in_flight=strings_of(item, "f"),
            in_flight_refs=strings_of(item, "fn"),
            attempts=({str(k): int(v["N"]) for k, v in attempts["M"].items()} if attempts else {}),
            done=tuple(done["L"]) if done else (),
            dead=strings_of(item, "x"),
            dead_refs=strings_of(item, "xn"),
            indexed="gp" in item,
            index_at=number_of(item, "gx"),
            halted="h" in item,
            redrive_nonce=string_of(item, "rv"),
            redrive_moved=number_of(item, "rn") or 0,
            redrive_at=number_of(item, "ra") or 0,
            size=item_bytes(item),
            done_size=value_bytes(done) if done else 0,
            unclaimed=claimed is not None and not claimed["BOOL"],
        )

    def started(self) -> tuple[str, ...]:
        """[G5] The in-flight ids a run of which started: all but an unclaimed grant's own
        signal (first in flight), whose envelope never claimed it. The item keeps ``c`` after
        the deadline passed, so a requeue reads it from the dead owner's grant."""
        return self.in_flight[1:] if self.unclaimed else self.in_flight

    def live_owner(self, owner: str, now: int) -> bool:
        """``owner`` holds the lease by its own clock (what owner-side steps require)."""
        return self.owner == owner and self.expiry > now

    def live_grant(self, owner: str, now: int, token: int | None) -> bool:
        """:meth:`live_owner`, with a token, and with exactly ``token`` when one is given."""
        return (
            self.live_owner(owner, now) and self.token is not None and token in (None, self.token)
        )

    def free_for(self, owner: str, now: int, cutoff: int) -> bool:
        """Free as far as ``owner`` is concerned (the condition ``FREE_FOR_ME``): nobody holds
        it, or it is ``owner``'s own lease that ran out by ``owner``'s clock."""
        return (
            self.owner is None
            or self.expiry < cutoff
            or (self.owner == owner and self.expiry <= now)
        )

    def summary(self) -> str:
        """What the item held, for an error message (ids are not repeated: they can be long)."""
        if not self.exists:
            return "absent"
        owner = "free" if self.owner is None else f"held by {self.owner!r} until {self.expiry}"
        return (
            f"{owner}, {len(self.queue)} queued, {len(self.in_flight)} in flight,"
            f" {len(self.dead)} dead letters{', halted' if self.halted else ''}"
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

    def queue_bound(self, signal_id: str, ref: str, max_queue: int) -> int:
        """[Q8] The queue length below which a forward of ``signal_id`` (stored as ``ref``) may
        append to this snapshot: ``max_queue``, or less where the lease item must keep room
        for what its owner's writes may add (see ITEM_LIMIT_BYTES). Each further append is
        reckoned at this one's size; the append's condition caps the queue at the bound, so
        forwards racing on one snapshot cannot all take the room it shows."""
        reserve = max(0, DONE_RESERVE_BYTES - self.done_size)
        for sid in (*self.queue, *self.in_flight):
            if sid not in self.attempts:
                reserve += len(sid.encode("utf-8")) + _ATTEMPT_BYTES
        me = len(signal_id.encode("utf-8"))
        entry = me + len(ref.encode("utf-8")) + _ENTRY_BYTES + me + _ATTEMPT_BYTES
        room = ITEM_LIMIT_BYTES - ITEM_MARGIN_BYTES - self.size - reserve
        return min(max_queue, len(self.queue) + max(0, room // entry))

    def fits(self, signal_id: str, ref: str) -> bool:
        """Whether storing ``signal_id`` with an inline ``ref`` keeps this snapshot of the
        lease item within INLINE_ITEM_BYTES (appends racing with ours may overshoot it by
        their own entries)."""
        added = len(signal_id.encode("utf-8")) + len(ref.encode("utf-8")) + _ENTRY_BYTES
        return self.size + added + _EXTEND_BYTES <= INLINE_ITEM_BYTES

    def unchanged(self) -> tuple[str, dict[str, object]]:
        """The condition that the item's version is still the one read (``{version}``)."""
        if self.version is None:
            return VERSION_ABSENT, {}
        return VERSION_IS, {":was": self.version}

    def queue_unchanged(self) -> tuple[str, dict[str, object]]:
        """No append since the snapshot (``{queue}``; appends do not change the version)."""
        if not self.queue:
            return QUEUE_EMPTY, {":zero": 0}
        return QUEUE_SIZE_IS, {":nq": len(self.queue)}

    def pinned(self, template: str, values: dict[str, object]) -> str:
        """``template`` with ``{version}`` and ``{queue}`` pinned to this snapshot; the values
        those conditions use are added to ``values``."""
        version, version_values = self.unchanged()
        queue, queue_values = self.queue_unchanged()
        values.update(version_values)
        if "{queue}" in template:
            values.update(queue_values)
        return template.format(version=version, queue=queue)


def split_record(record: str) -> list[str]:
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


def item_sks(ref: str) -> list[str]:
    """The sort keys of a payload's items: ``sig#<ref>`` (the head, with the first piece and
    a dead letter's attributes), then ``sig#<ref>#1`` ... for the other pieces of a split one
    (whose ref ends in ``.<number of items>``)."""
    head = SIGNAL_SK_PREFIX + ref
    _, split, count = ref.rpartition(SPLIT)
    if not split or not count.isdigit() or not 2 <= int(count) <= _MAX_ITEMS:
        return [head]
    return [head, *(f"{head}{_PIECE}{i}" for i in range(1, int(count)))]


def grant_fits(key: str, signal_id: str, record: str) -> bool:
    """Whether a blind grant ([Q1]) of ``signal_id`` stores ``record`` inline."""
    written = sum(len(text.encode("utf-8")) for text in (key, signal_id, signal_id, record))
    reserved = _GRANT_WRITES_BYTES + _EXTEND_BYTES + _GRANT_UNSEEN_BYTES
    return written + reserved <= INLINE_ITEM_BYTES


def is_inline(ref: str) -> bool:
    return ref.startswith(INLINE)


def inline_record(ref: str) -> str:
    return ref[len(INLINE) :]


def item_bytes(item: Mapping[str, Any]) -> int:
    """An item's size by DynamoDB's rules (what its writes pay for per KB)."""
    return sum(len(name.encode("utf-8")) + value_bytes(value) for name, value in item.items())


def value_bytes(value: Mapping[str, Any]) -> int:
    """One attribute value's size by DynamoDB's rules (see :func:`item_bytes`)."""
    kind, body = next(iter(value.items()))
    if kind == "S":
        return len(str(body).encode("utf-8"))
    if kind == "N":
        digits = str(body).lstrip("-").replace(".", "").strip("0") or "0"
        return (len(digits) + 1) // 2 + 1
    if kind == "B":
        return len(body)
    if kind == "L":
        return 3 + sum(1 + value_bytes(v) for v in body)
    if kind == "M":
        return 3 + sum(1 + len(k.encode("utf-8")) + value_bytes(v) for k, v in body.items())
    return 1
