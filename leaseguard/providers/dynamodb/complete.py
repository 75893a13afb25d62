"""[G6] completing an owner's in-flight signals, then what follows: [L4] free, [T1] transfer,
or [N1] [N2] [N3] hand off; and [G2] pruning the completed-id memory."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leaseguard.errors import LeaseBackendError
from leaseguard.protocol.model import Failure
from leaseguard.providers.base import new_nonce
from leaseguard.signals import decode_signal
from leaseguard.types import Signal

from .done import marker, plain, resume_tag, rewrite
from .expressions import (
    ATTEMPTS,
    ATTEMPTS_SET,
    COMPLETE_CONDITION,
    COMPLETE_RELEASE_CONDITION,
    COMPLETE_REMOVES,
    COMPLETE_SETS,
    COMPLETE_UPDATE,
    DEAD_LETTER_SETS,
    GONE_AHEAD_SETS,
    HALT_SET,
    MARK_DEAD_UPDATE,
    PAYLOAD_EXISTS,
    PRUNE_CONDITION,
    PRUNE_UPDATE,
    QUEUE_AT_HEAD,
    QUEUE_ELEMENT,
    REMEMBER_DONE,
    REWRITE_DONE,
    THEN_FREE_REMOVES,
    THEN_FREE_SETS,
    THEN_HALTED_REMOVES,
    THEN_HALTED_SETS,
    THEN_NEXT_SETS,
    THEN_RELEASED_REMOVES,
    THEN_RELEASED_SETS,
    THEN_TO_REMOVES,
    THEN_TO_SETS,
)
from .io import ConditionFailed, Retry, Table
from .schema import SIGNAL_SK_PREFIX, Lease, attribute_value, inline_record, is_inline

# At most this many gone queue entries are named in one write: an UpdateExpression is limited
# to 4 KB (``#q[99], #qn[99]`` is 15 characters). As for takes (take.py), 64 rather than ~200.
_GONE_BATCH = 64


@dataclass(frozen=True)
class Then:
    """What a completion ([G6]) is followed by: ``free`` (release_lease [L4]), ``to`` (transfer
    the lease to ``to_owner`` [T1]) or ``next`` (hand off or release [N1] [N2] [N3])."""

    kind: str
    ttl_ms: int = 0
    claim: bool = True
    to_owner: str = ""


def complete(
    table: Table,
    key: str,
    lease: Lease,
    owner: str,
    now: int,
    failure: Failure | None,
    then: Then,
) -> Signal | bool | Retry | None:
    """[G6] complete the owner's in-flight signals, then ``then``: one write conditional on
    the snapshot ``lease`` (the live grant, its version; appends allowed for).

    Returns the next owner's signal ([N2] [N3]), None ([N1]), True ([L4] [T1]), or a
    :class:`Retry` with the item as it stands."""
    token = lease.token
    if token is None:  # every grant writes ``t``; an item without one was not written by us
        raise LeaseBackendError(f"the lease item of {key!r} has an owner but no fencing token")
    attempts = dict(lease.attempts)
    done_ids: list[str] = []
    back: list[tuple[str, str]] = []
    dead: list[tuple[str, str, int]] = []
    drop: list[str] = []
    own_attempts = 0
    # [G6] past this many dead letters on the key a failed signal waits at the head instead
    # (redrives change the version this write is pinned to, so the snapshot's count holds)
    room = table.dead_limit - len(lease.dead)
    kept = False
    for sid, ref in zip(lease.in_flight, lease.in_flight_refs, strict=False):
        attempts.pop(sid, None)
        verdict = failure.verdict(sid) if failure else "ok"
        if failure is None or verdict == "ok":
            done_ids.append(sid)
            drop.append(ref)
            continue
        count = lease.attempts.get(sid, 0) + (verdict == "failed")
        if verdict == "unrun":  # [G8] it never ran: back to the head, its count kept
            if count:
                attempts[sid] = count
            back.append((sid, ref))
        elif count >= failure.max_attempts and len(dead) < room:
            dead.append((sid, ref, count))  # [G6] dead-lettered (the owner's own too)
        elif count >= failure.max_attempts:
            # [G6] no room for another dead letter: back to the head with its count (the
            # owner's own too: never dropped), the key halted until a redrive [V1]
            attempts[sid] = count
            back.append((sid, ref))
            kept = True
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
    # A partial report [G8] remembers its completed ids as one succeeded batch, then (when
    # its owner did not succeed) the owner's failed entry as a batch of its own.
    owner_ok = failure is None or failure.verdict(owner) == "ok"
    # The owner last, as the model's remember_done leaves it (its own entry after the in-flight
    # ids'): a completion larger than DONE_LIMIT then forgets the same ids on every backend.
    batch: list[Any] = list(done_ids)
    if then.kind == "next" and owner_ok:
        batch = [sid for sid in done_ids if sid != owner] + [owner]
    entries: list[Any] = [*batch, marker(now, token, True)] if batch else []
    if not owner_ok:
        failed_entry = [[owner, own_attempts], resume_tag(owner)] if own_attempts else [[owner]]
        entries += [*failed_entry, marker(now, token, False)]
    version = new_nonce()
    values: dict[str, object] = {}
    condition = lease.pinned(COMPLETE_CONDITION, values)
    values.update({":me": owner, ":now": now, ":tok": token, ":v": version, ":empty": []})
    sets = list(COMPLETE_SETS)
    if entries:
        remember(sets, values, lease, entries, now)
    removes = list(COMPLETE_REMOVES)
    if dead:
        error = failure.error if failure else ""
        sets += DEAD_LETTER_SETS
        values[":xid"] = [sid for sid, _, _ in dead]
        values[":xref"] = [mark_dead(table, key, *letter, error, now) for letter in dead]
        values[":dshard"] = table.dead_shard(key)
    halting = kept or (bool(dead) and failure is not None and failure.halt)
    if halting:
        sets.append(HALT_SET)
        values[":true"] = True
    result: Signal | bool | None
    if then.kind == "free":  # [L4] then [G7]: the queue stays, for the sweeper
        sets += THEN_FREE_SETS
        removes += THEN_FREE_REMOVES
        values.update({":zero": 0, ":ttl": table.ttl(now)})
        result = True
    elif then.kind == "to":  # [T1] the grant ([G3]) to to_owner, prev = owner
        sets += THEN_TO_SETS
        removes += THEN_TO_REMOVES
        values.update(
            {
                ":to": then.to_owner,
                ":exp": now + then.ttl_ms,
                ":new": token + 1,
                ":true": True,
                ":ttl": table.ttl(now + then.ttl_ms),
            }
        )
        result = True
    elif lease.halted or halting:
        # [N1] halted: released with the queue kept (the retried signals at its head, in
        # order); appends since the snapshot stay behind them. A halted key leaves the
        # orphan index: nothing of it is adopted until a redrive ([D4] [V1]).
        if back:
            _put_at_head(sets, values, back)
        sets += THEN_HALTED_SETS
        removes += THEN_HALTED_REMOVES
        values[":ttl"] = table.ttl(now)
        result = None
    else:
        ids = [sid for sid, _ in back] + list(lease.queue)
        refs = [ref for _, ref in back] + list(lease.queue_refs)
        head_at, stored = table.first_payload(key, refs)
        for sid in ids[: head_at if stored is not None else len(ids)]:
            attempts.pop(sid, None)  # payload gone (TTL): dropped
        if stored is None:
            # [N1] nothing (with a payload) queued: released. Conditional on no append
            # since the snapshot, whose signal would otherwise be dropped with the queue.
            condition = lease.pinned(COMPLETE_RELEASE_CONDITION, values)
            sets += THEN_RELEASED_SETS
            removes += THEN_RELEASED_REMOVES
            values[":ttl"] = table.ttl(now)
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
                if upto > _GONE_BATCH:
                    # more gone entries ahead of the head than one expression can name
                    return _drop_gone(table, key, lease, owner, now)
                removes += [QUEUE_ELEMENT.format(index=i) for i in range(upto + 1)]
            sets += THEN_NEXT_SETS
            values.update(
                {
                    ":next": head,
                    ":exp": now + then.ttl_ms,
                    ":new": new_token,
                    ":claimed": then.claim,
                    ":f": [head],
                    ":fn": [refs[head_at]],
                    ":shard": table.shard(key),
                    ":ttl": table.ttl(now + then.ttl_ms),
                }
            )
            result = decode_signal(head, stored, new_token, attempts.get(head, 0))
    update = with_attempts(sets, removes, values, attempts)
    try:
        table.update(key, update, condition, values)
    except ConditionFailed as failed:
        if failed.lease.version != version:  # else: a resend of this write, applied
            return Retry(failed.lease)
    if drop:
        table.delete_signals(key, drop)
    return result


def _drop_gone(table: Table, key: str, lease: Lease, owner: str, now: int) -> Retry:
    """The first _GONE_BATCH queued entries, whose payloads are gone (TTL), leave the queue
    (with their attempt counts), conditional on the snapshot; the completion then starts
    again from a fresh read. Before, a queue that waited past the payloads' retention made the
    completion's expression name every gone entry: over DynamoDB's 4 KB, refused every time."""
    gone = set(lease.queue[:_GONE_BATCH])
    attempts = {sid: n for sid, n in lease.attempts.items() if sid not in gone}
    values: dict[str, object] = {}
    condition = lease.pinned(COMPLETE_CONDITION, values)
    values.update({":me": owner, ":now": now, ":tok": lease.token, ":v": new_nonce()})
    removes = [QUEUE_ELEMENT.format(index=i) for i in range(_GONE_BATCH)]
    update = with_attempts(list(GONE_AHEAD_SETS), removes, values, attempts)
    try:
        table.update(key, update, condition, values)
    except ConditionFailed as failed:
        return Retry(failed.lease)
    return Retry()


def remember(
    sets: list[str], values: dict[str, object], lease: Lease, entries: list[Any], now: int
) -> None:
    """[G2] ``entries`` (a completed batch and its marker) appended to ``d``, or, once enough
    of ``d`` is forgotten, ``d`` rewritten as what it remembers with them: in the same write,
    pinned to the snapshot ``lease``, so that ``d`` never holds more than DONE_STORED_BYTES
    after a completion, whatever its size (``values`` must hold ``:empty``)."""
    rewritten = rewrite([*lease.done, *(attribute_value(e) for e in entries)], now)
    if rewritten is None:
        sets.append(REMEMBER_DONE)
        values[":done"] = entries
    else:
        sets.append(REWRITE_DONE)
        values[":done"] = [plain(element) for element in rewritten]


def with_attempts(
    sets: list[str], removes: list[str], values: dict[str, object], attempts: Mapping[str, int]
) -> str:
    """The update of ``sets`` and ``removes``, with the attempt counts written whole (``a``
    removed when none is left)."""
    if attempts:
        sets.append(ATTEMPTS_SET)
        values[":a"] = attempts
    else:
        removes.append(ATTEMPTS)
    if not removes:
        return "SET " + ", ".join(sets)
    return COMPLETE_UPDATE.format(sets=", ".join(sets), removes=", ".join(removes))


def _put_at_head(sets: list[str], values: dict[str, Any], items: Sequence[tuple[str, str]]) -> None:
    """[G5]/[G6] ``(id, payload ref)`` pairs go to the head of the queue, in order; appends
    since the snapshot stay behind them (``values`` must hold ``:empty``)."""
    sets += QUEUE_AT_HEAD
    values[":rq"] = [sid for sid, _ in items]
    values[":rqn"] = [ref for _, ref in items]


def prune(table: Table, key: str, done: Sequence[Mapping[str, Any]], now: int) -> None:
    """After a write that appended to ``d`` without seeing it (``done``: ``d`` as that write
    left it), rewrite ``d`` as what it remembers once enough of it is forgotten ([G2]): one
    write, conditional on ``d`` being as it was (its length and its last element, a unique
    marker: ``d`` only grows at its tail by completions, each ending in a new marker). Best
    effort: a failure leaves it to the next completion, which rewrites it in its own write."""
    rewritten = rewrite(done, now)
    if rewritten is None or not done:
        return
    with contextlib.suppress(ConditionFailed, LeaseBackendError):
        table.update(
            key,
            PRUNE_UPDATE,
            PRUNE_CONDITION.format(last=len(done) - 1),
            {
                ":done": [plain(element) for element in rewritten],
                ":n": len(done),
                ":m": int(done[-1]["N"]),
            },
        )


def mark_dead(
    table: Table, key: str, signal_id: str, ref: str, attempts: int, error: str, now: int
) -> str:
    """[G6] A dead letter's error, attempts and time live on its payload item (written
    before the lease item lists it, so a listed dead letter always has them); the item is
    kept as long as the lease item. Returns the ref the dead letter is listed with."""
    if is_inline(ref):
        # Dead letters stay until a redrive and hold their error: out of the lease item,
        # which every write pays for, into a payload item of their own. If the completion
        # that lists it is refused, nothing references that item; its TTL reaps it.
        failed = {"de": {"S": error}, "da": {"N": str(attempts)}, "df": {"N": str(now)}}
        return table.put_signal(key, signal_id, inline_record(ref), now, failed)
    # A payload already gone (TTL) refuses: the dead letter is listed without it.
    with contextlib.suppress(ConditionFailed):
        table.update(
            key,
            MARK_DEAD_UPDATE,
            PAYLOAD_EXISTS,
            {":err": error, ":att": attempts, ":at": now, ":ttl": table.ttl(now)},
            sk=SIGNAL_SK_PREFIX + ref,
        )
    # the other pieces of a split payload are kept as long as its head
    table.renew_payloads(key, [ref], now, pieces=True)
    return ref
