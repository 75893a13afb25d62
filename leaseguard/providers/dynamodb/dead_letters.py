"""Dead letters and what an operator sees: [V1] [V2] [V3] redrive, the ``dead_letters`` index, and
inspect_key."""

from __future__ import annotations

from leaseguard.protocol.model import DEDUPE_WINDOW_MS
from leaseguard.providers.base import new_nonce
from leaseguard.signals import decode_signal
from leaseguard.types import DeadLetter, KeyState

from .contention import optimistic_tries, unsettled
from .expressions import DEAD_LETTER_KEYS, REDRIVE_ALL_UPDATE, REDRIVE_UPDATE
from .io import ConditionFailed, Table
from .schema import DEAD_LETTER_INDEX, Lease, number_of, string_of


def redrive(table: Table, key: str, ids: tuple[str, ...] | None) -> int:
    lease: Lease | None = None
    renewed: set[str] = set()
    # The call's nonce, drawn once: every try and botocore's resends of a write carry it, so a
    # write that applied is known when its reply was lost ([V3]).
    call = new_nonce()
    for _ in optimistic_tries():
        now, _ = table.times()
        if lease is None:
            lease = table.read(key)
        if lease.redrive_nonce == call and lease.redrive_at > now - DEDUPE_WINDOW_MS:
            return lease.redrive_moved  # [V3] this call applied: what it moved
        moved = [i for i, sid in enumerate(lease.dead) if ids is None or sid in ids]
        if not moved:
            return 0  # [V2] nothing matches
        kept = [i for i in range(len(lease.dead)) if i not in moved]
        moved_ids = [lease.dead[i] for i in moved]
        moved_refs = [lease.dead_refs[i] for i in moved if i < len(lease.dead_refs)]
        # Their payload items expire retention_s after they failed: before the queue lists
        # them again, they get a full retention_s from now (once per call; an item already
        # gone stays gone and the signal is dropped when it reaches the head, [N1]).
        table.renew_payloads(
            key, [ref for ref in moved_refs if ref not in renewed], now, pieces=False
        )
        renewed.update(moved_refs)
        version = new_nonce()
        condition, values = lease.unchanged()
        values.update(
            {
                ":v": version,
                ":empty": [],
                ":rq": moved_ids,
                ":rqn": moved_refs,
                ":shard": table.shard(key),
                # a free key's work is orphaned at once; a live owner's is indexed at its
                # deadline (renewals since then are met by the sweep, as for [Q2])
                ":gx": lease.expiry if lease.owner is not None else 0,
                ":ttl": table.ttl(max(now, lease.expiry)),
                ":rv": call,
                ":rn": len(moved),
                ":now": now,
            }
        )
        # [V1] the dead letters go to the head of the queue in the order they died (with
        # no attempts counted: ``a`` holds none for them), appends since the snapshot
        # stay behind; the key is no longer halted and is in the orphan index, so the next
        # event ([Q6]) or the sweeper ([D1]) runs them when it is free.
        if kept:
            update = REDRIVE_UPDATE
            values[":x"] = [lease.dead[i] for i in kept]
            values[":xn"] = [lease.dead_refs[i] for i in kept if i < len(lease.dead_refs)]
        else:
            update = REDRIVE_ALL_UPDATE  # no dead letters left: out of that index
        try:
            table.update(key, update, condition, values)
        except ConditionFailed as failed:
            # Another writer, or a resend of this write that was applied: look again (a
            # resend then finds this call remembered, [V3], as the model answers it).
            lease = failed.lease
            continue
        return len(moved)
    raise unsettled("redrive", key, lease)


def dead_letter_keys(table: Table, limit: int) -> list[str]:
    """Keys with dead letters, from the sparse ``dead_letters`` index (``gd`` is set by the
    write that dead-letters a signal and removed by the redrive that moves the last one):
    one Query per shard and page, never a Scan. The index is eventually consistent: a key
    redriven a moment ago may still be listed."""
    found: list[str] = []
    for shard in range(table.orphan_shards):
        for key in table.index_keys(DEAD_LETTER_INDEX, DEAD_LETTER_KEYS, f"dead#{shard}"):
            if key not in found:
                found.append(key)
            if len(found) >= limit:
                return sorted(found)
    return sorted(found)


def inspect(table: Table, key: str) -> KeyState:
    now, cutoff = table.times()
    lease = table.read(key)
    items = table.payload_items(key, list(lease.queue_refs + lease.dead_refs), ("de", "da", "df"))
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
                attempts=number_of(item, "da") or 0,
                error=string_of(item, "de") or "",
                enqueued_at_ms=signal.enqueued_at_ms,
                failed_at_ms=number_of(item, "df") or 0,
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
