"""Grants of a dead owner's work: [G4] [G5] the orphan grant, [C1]-[C4] claim_signal and
[D1]-[D4] adopt_orphans (the sweep of the sparse ``orphans`` index)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

from leaseguard.providers.base import new_nonce
from leaseguard.signals import decode_signal
from leaseguard.types import Signal

from .contention import optimistic_tries, unsettled
from .expressions import (
    CLAIM_CONDITION,
    CLAIM_UPDATE,
    DROP_GONE_UPDATE,
    ENVELOPE_CONDITION,
    ORPHAN_CONDITION,
    ORPHAN_GRANT_ALONE_FRESH_UPDATE,
    ORPHAN_GRANT_ALONE_UPDATE,
    ORPHAN_GRANT_FRESH_UPDATE,
    ORPHAN_GRANT_UPDATE,
    ORPHAN_KEYS,
    REINDEX_CONDITION,
    REINDEX_UPDATE,
    UNINDEX_CONDITION,
    UNINDEX_UPDATE,
)
from .io import ConditionFailed, Retry, Table
from .schema import ORPHAN_INDEX, Lease


def grant_orphan(
    table: Table,
    key: str,
    lease: Lease,
    ttl_ms: int,
    claim: bool,
    extra: tuple[str, str] | None,
    nonce: str,
    now: int,
    cutoff: int,
    *,
    envelope: tuple[str, int] | None = None,
    resume: int = 0,
) -> tuple[str, Signal] | Retry | None:
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
    head_at, stored = table.first_payload(key, refs)
    if envelope is not None and (stored is None or head_at != 0):
        return None  # [C3] the envelope's signal is no longer stored (its payload's TTL)
    version = new_nonce()
    values: dict[str, object] = {}
    condition = lease.pinned(ORPHAN_CONDITION if envelope is None else ENVELOPE_CONDITION, values)
    values.update({":cutoff": cutoff, ":v": version, ":w": nonce})
    if envelope is not None:
        values.update({":env": envelope[0], ":tok": envelope[1]})
    if stored is None:
        try:
            table.update(key, DROP_GONE_UPDATE, condition, values)
        except ConditionFailed as failed:
            return None if failed.lease.version == version else Retry(failed.lease)
        return None
    head = ids[head_at]
    rest_ids, rest_refs = ids[head_at + 1 :], refs[head_at + 1 :]
    token = lease.token + 1 if lease.token is not None else now * 1000 + 1
    attempts = {sid: n for sid, n in {**lease.attempts, **resumed}.items() if sid in ids[head_at:]}
    for sid in lease.started():  # [G5] a run that started and never finished counts
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
            ":shard": table.shard(key),
            ":ttl": table.ttl(now + ttl_ms),
            ":a": attempts,
        }
    )
    if rest_ids:
        update = ORPHAN_GRANT_UPDATE if attempts else ORPHAN_GRANT_FRESH_UPDATE
    else:
        update = ORPHAN_GRANT_ALONE_UPDATE if attempts else ORPHAN_GRANT_ALONE_FRESH_UPDATE
    signal = decode_signal(head, stored, token, attempts.get(head, 0))
    try:
        table.update(key, update, condition, values)
    except ConditionFailed as failed:
        old = failed.lease
        if old.version == version:
            return head, signal  # a botocore resend of this write, applied earlier
        if old.grant_nonce == nonce and old.holder(cutoff) is not None and old.owner:
            # [Q7] / [D3] applied earlier, then another writer (an append) changed the
            # item: the grant is still ours
            again = table.stored_signal(key, old, old.owner, old.token)
            if again is not None:
                return old.owner, again
        return Retry(old)
    return head, signal


def claim(table: Table, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
    nonce = new_nonce()  # this claim's grant nonce: a resend of its write finds it in ``w``
    lease: Lease | None = None
    for _ in optimistic_tries():
        now, cutoff = table.times()
        if lease is None:
            lease = table.read(key)
        if lease.live_owner(owner, now) and lease.grant_nonce == nonce:
            # [C1] / [C4] again: a resend of this claim's write, which was applied
            return table.stored_signal(key, lease, owner, lease.token)
        if (
            lease.holder(cutoff) is None
            and lease.token == token
            and lease.in_flight[:1] == (owner,)
            and not lease.halted
        ):
            # [C4] the grant's lease ran out with its signal still in flight: [G5] (one
            # more attempt) and [G4] it owns the key again, claimed, under a new token
            again = grant_orphan(
                table, key, lease, ttl_ms, True, None, nonce, now, cutoff, envelope=(owner, token)
            )
            if isinstance(again, Retry):
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
        stored = table.payloads(key, [ref]).get(ref)
        if stored is None:
            return None
        try:
            # [C1] claimed once, under this call's grant nonce; the deadline is refreshed
            table.update(
                key,
                CLAIM_UPDATE,
                CLAIM_CONDITION,
                {
                    ":me": owner,
                    ":now": now,
                    ":tok": token,
                    ":true": True,
                    ":false": False,
                    ":exp": now + ttl_ms,
                    ":ttl": table.ttl(now + ttl_ms),
                    ":w": nonce,
                    ":v": new_nonce(),
                },
            )
        except ConditionFailed as failed:
            if failed.lease.grant_nonce != nonce:
                lease = failed.lease  # claimed by another call, or it moved: look again
                continue
        return decode_signal(owner, stored, token, lease.attempts.get(owner, 0))
    raise unsettled("claim", key, lease)


def adopt(table: Table, ttl_ms: int, limit: int, claim: bool) -> list[tuple[str, Signal]]:
    adopted: list[tuple[str, Signal]] = []
    first = random.randrange(table.orphan_shards)  # no shard starves behind another
    for step in range(table.orphan_shards):
        shard = f"orph#{(first + step) % table.orphan_shards}"
        for key in _orphan_candidates(table, shard):
            signal = _adopt_key(table, key, ttl_ms, claim)
            if signal is not None:
                adopted.append((key, signal))
                if len(adopted) >= limit:
                    return adopted
    return adopted


def _orphan_candidates(table: Table, shard: str) -> Iterator[str]:
    """Keys in one index shard whose indexed deadline passed, oldest first. The index is
    eventually consistent and its deadline a hint: every candidate is re-checked."""
    _, cutoff = table.times()
    return table.index_keys(ORPHAN_INDEX, ORPHAN_KEYS, shard, cutoff)


def _adopt_key(table: Table, key: str, ttl_ms: int, claim: bool) -> Signal | None:
    nonce = new_nonce()  # this adoption's grant nonce: [D3] recognises it when resent
    lease: Lease | None = None
    for _ in optimistic_tries():
        now, cutoff = table.times()
        if lease is None:
            lease = table.read(key)
        if not lease.exists or not lease.indexed:
            return None
        holder = lease.holder(cutoff)
        if holder is not None:
            if lease.grant_nonce == nonce:  # [D3] a resend of this adoption
                return table.stored_signal(key, lease, holder, lease.token)
            if lease.index_at is None or lease.index_at < cutoff:
                # [D2] The owner renewed since it was indexed: move its entry to its deadline.
                try:
                    table.update(key, REINDEX_UPDATE, REINDEX_CONDITION, {":cutoff": cutoff})
                except ConditionFailed:
                    lease = None
                    continue
            return None  # [D2] the owner is alive
        if lease.halted:
            # [D4] halted: nothing is adopted until a redrive, and the key leaves the
            # orphan index (an append or release under a plain owner may have put it
            # back); a redrive ([V1]) indexes it again. Index moves keep the version.
            with contextlib.suppress(ConditionFailed):
                table.update(key, UNINDEX_UPDATE, UNINDEX_CONDITION, {})
            return None
        # [D1] the head of the dead owner's work owns the key
        result = grant_orphan(table, key, lease, ttl_ms, claim, None, nonce, now, cutoff)
        if not isinstance(result, Retry):
            return result[1] if result is not None else None
        lease = result.lease
    raise unsettled("adoption", key, lease)
