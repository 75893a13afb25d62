"""[Q1]-[Q9] acquire_or_enqueue: a forwarded signal is granted the key, queued behind its
holder, or recognised as a duplicate."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from leaseguard.errors import QueueFull
from leaseguard.providers.base import new_nonce
from leaseguard.types import LeaseResult, Signal

from .adopt import grant_orphan
from .contention import optimistic_tries, unsettled
from .done import Done, done_view, resume_tag
from .expressions import (
    APPEND_CONDITION,
    APPEND_HALTED_CONDITION,
    APPEND_HALTED_RESUMED_CONDITION,
    APPEND_HALTED_RESUMED_UPDATE,
    APPEND_HALTED_UPDATE,
    APPEND_RESUMED_CONDITION,
    APPEND_RESUMED_UPDATE,
    APPEND_UPDATE,
    DONE_ELEMENT,
    DONE_ELEMENT_IS,
    FORGET_UPDATE,
    GRANT_FREE_CONDITION,
    GRANT_FREE_UPDATE,
    GRANT_PINNED_UPDATE,
    GRANT_RESUMED_CONDITION,
    GRANT_RESUMED_UPDATE,
    REQUEUE_HALTED_CONDITION,
    REQUEUE_HALTED_UPDATE,
)
from .io import ConditionFailed, Retry, Table
from .schema import INLINE, Lease, grant_fits, is_inline, number_of


def acquire_or_enqueue(
    table: Table, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
) -> LeaseResult:
    me = signal.id
    now, _ = table.times()
    # A small record goes inline: the write that references it stores it, atomically, and
    # a refused write stores nothing. A larger one gets a payload item, written first, so
    # no lease item ever references a payload that is not there yet. That item is not
    # deleted here when the signal turns out to be a duplicate: a write of this call may
    # have been applied with its reply lost (or after botocore gave up), so only the
    # completing owner, which sees the lease item reference it, deletes it; an
    # unreferenced one is reaped by its TTL. The one exception is [Q8] below.
    ref = INLINE + record if grant_fits(key, me, record) else table.put_signal(key, me, record, now)
    nonce = new_nonce()  # this call's grant nonce: [Q7] recognises its applied grants
    lease: Lease | None = None
    seen: Lease | None = None  # the item as the last try saw it, for the error below
    for _ in optimistic_tries():
        now, cutoff = table.times()
        if lease is None:
            granted = _grant_free(table, key, me, ref, ttl_ms, nonce, now, cutoff)
            if isinstance(granted, LeaseResult):
                return granted
            lease = granted
        seen = lease
        holder = lease.holder(cutoff)
        if holder is not None and lease.grant_nonce == nonce and holder in lease.in_flight:
            # [Q7] a resend of this very call, which was applied (by the grant or adoption),
            # while the granted signal is in flight (a take's report [K1] can complete it
            # under the same grant; then the rows below answer, as for any later delivery)
            return _granted(table, key, lease, holder, me)
        token = lease.token if holder is not None else None
        view = done_view(lease.done, now)
        done = view.get(me)
        if (done is not None and done.ok) or me in lease.dead:
            return LeaseResult(False, holder, token)  # [Q5] completed or dead-lettered
        if _forget(table, key, lease, me, view):
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
            ref = _fitted(table, key, lease, me, ref, record, now)
            if not resume and len(lease.dead) < BLIND_DEAD_LETTERS:
                lease = None  # free and idle again: [Q1] once more
                continue
            # A failed run's retry resumes its count, and a key with many dead letters may
            # have no room left (they fill its item as forwards do): by the snapshot.
            if lease.queue_bound(me, ref, max_queue) < 1:
                table.delete_signals(key, [ref])
                raise QueueFull(key, 0, max_queue, None, _why_full(lease))
            granted = _grant_pinned(table, key, lease, me, ref, ttl_ms, nonce, resume, now, cutoff)
            if isinstance(granted, LeaseResult):
                return granted
            lease = granted
            continue
        bound = lease.queue_bound(me, ref, max_queue)
        if not known and len(lease.queue) >= bound:
            # [Q8] the queue is at its bound (max_queue, or what the item's size leaves):
            # refused, nothing stored. The refusal just seen is the item as it stands and no
            # write of this call references ``ref`` in it (each was refused, or it would show
            # here as [Q7] / [Q3] / [Q5]), so its payload item, if it has one, is deleted: a
            # refused forward leaves nothing.
            table.delete_signals(key, [ref])
            why = _why_full(lease) if bound < max_queue else None
            raise QueueFull(key, len(lease.queue), max_queue, holder, why)
        ref = _fitted(table, key, lease, me, ref, record, now)
        resumed = (lease, resume) if resume else None
        if holder is not None:
            appended = _append(table, key, me, ref, cutoff, bound, resumed=resumed)  # [Q2]
            if isinstance(appended, LeaseResult):
                return appended
            lease = appended
            continue
        if lease.halted:
            # [Q9] free and halted: queued behind the dead letter, nothing is granted
            if lease.in_flight:
                queued = _requeue_halted(table, key, lease, (me, ref), cutoff, resume)
            elif not known:
                queued = _append(table, key, me, ref, cutoff, bound, halted=True, resumed=resumed)
            else:  # already queued, nothing in flight: nothing to write
                queued = LeaseResult(False, None, None, position=lease.queue.index(me) + 1)
            if isinstance(queued, LeaseResult):
                return queued
            lease = queued
            continue
        # [Q6] orphaned: the dead owner's work first, this signal behind it, the head owns
        adopted = grant_orphan(
            table, key, lease, ttl_ms, True, (me, ref), nonce, now, cutoff, resume=resume
        )
        if isinstance(adopted, Retry):
            lease = adopted.lease
            continue
        if adopted is None:  # every payload was gone (TTL) and ours too: again
            lease = None
            continue
        head, owner_signal = adopted
        if head == me:
            return LeaseResult(True, me, owner_signal.token, attempts=owner_signal.attempts)
        return LeaseResult(True, head, owner_signal.token, adopted=owner_signal)
    raise unsettled("acquire_or_enqueue", key, lease or seen)


# With this many dead letters or more, a key's blind grant ([Q1]) refuses, and the grant is
# made from the snapshot after the item's room is judged (see schema.ITEM_LIMIT_BYTES): else a
# key whose events run alone and keep failing would add dead letters until it was stuck.
BLIND_DEAD_LETTERS = 64


def _why_full(lease: Lease) -> str:
    """Why the queue is full below max_queue: the lease item's size."""
    why = (
        f"its DynamoDB lease item holds {lease.size:,} bytes ({len(lease.queue)} queued,"
        f" {len(lease.dead)} dead letters, {lease.done_size:,} bytes of completed ids), and"
        " what its owner's writes may add must still fit in DynamoDB's 400 KB item limit"
    )
    if lease.dead:
        return why + "; redriving its dead letters (once their cause is fixed) makes room"
    return why + "; shorter signal ids take less room"


def _fitted(table: Table, key: str, lease: Lease, me: str, ref: str, record: str, now: int) -> str:
    """``ref``, unless it is inline and would take the lease item (as the snapshot ``lease``
    shows it) past its inline budget: then the record's payload item, written now. Every
    later write of the call uses that ref; an earlier one that was applied is recognised
    by its id ([Q3] [Q7]), so the signal is never stored twice."""
    if is_inline(ref) and not lease.fits(me, ref):
        return table.put_signal(key, me, record, now)
    return ref


def _grant_free(
    table: Table, key: str, me: str, ref: str, ttl_ms: int, nonce: str, now: int, cutoff: int
) -> LeaseResult | Lease:
    """[Q1] free, nothing queued or in flight, not halted, ``me`` neither completed nor
    dead-lettered: ``me`` owns the key and stays in flight. Otherwise the item as it stands
    (ALL_OLD)."""
    try:
        attrs = table.update(
            key,
            GRANT_FREE_UPDATE,
            GRANT_FREE_CONDITION,
            {
                **_grant_values(table, key, me, ref, ttl_ms, nonce, new_nonce(), now, cutoff),
                ":tag": resume_tag(me),
                ":xfew": BLIND_DEAD_LETTERS,
            },
            returns="UPDATED_NEW",
        )
    except ConditionFailed as failed:
        return failed.lease
    return LeaseResult(True, me, number_of(attrs, "t"))


def _grant_values(
    table: Table,
    key: str,
    me: str,
    ref: str,
    ttl_ms: int,
    nonce: str,
    version: str,
    now: int,
    cutoff: int,
) -> dict[str, object]:
    """The values of a [Q1] grant of ``me`` (stored as ``ref``), blind or pinned."""
    return {
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
        ":shard": table.shard(key),
        ":ttl": table.ttl(now + ttl_ms),
        ":cutoff": cutoff,
    }


def _grant_pinned(
    table: Table,
    key: str,
    lease: Lease,
    me: str,
    ref: str,
    ttl_ms: int,
    nonce: str,
    attempts: int,
    now: int,
    cutoff: int,
) -> LeaseResult | Lease:
    """[Q1] from the snapshot ``lease``: for a retry of an own event whose run failed (its
    done entry carries ``attempts``, which its stored attempts resume), or, with ``attempts``
    0, on a key whose dead letters made the blind grant refuse. As :func:`_grant_free`,
    conditional on the snapshot (version, queue length); otherwise the item as it stands
    (ALL_OLD)."""
    version = new_nonce()
    values: dict[str, object] = {}
    condition = lease.pinned(GRANT_RESUMED_CONDITION, values)
    values.update(_grant_values(table, key, me, ref, ttl_ms, nonce, version, now, cutoff))
    update = GRANT_PINNED_UPDATE
    if attempts:
        update = GRANT_RESUMED_UPDATE
        values[":a"] = {me: attempts}
    try:
        attrs = table.update(key, update, condition, values, returns="UPDATED_NEW")
    except ConditionFailed as failed:
        if failed.lease.version == version:  # a botocore resend of this grant, applied
            return LeaseResult(True, me, failed.lease.token, attempts=attempts)
        return failed.lease
    return LeaseResult(True, me, number_of(attrs, "t"), attempts=attempts)


def _granted(table: Table, key: str, lease: Lease, holder: str, me: str) -> LeaseResult:
    """The reply of a grant that is the current lease, held by ``holder`` (model
    ``granted``)."""
    if holder == me:
        return LeaseResult(True, me, lease.token, attempts=lease.attempts.get(me, 0))
    adopted = table.stored_signal(key, lease, holder, lease.token)
    return LeaseResult(True, holder, lease.token, adopted=adopted)


def _forget(table: Table, key: str, lease: Lease, me: str, view: Mapping[str, Done]) -> bool:
    """[G2] ``d`` still holds entries of ``me`` that do not deduplicate it (forgotten: past
    the window or the limits; or replaced by a later failed run): they would refuse the
    [Q1] / [Q2] conditions, so remove them (each conditional on still being at its
    index). True when something was removed."""
    done = view.get(me)
    if done is not None and done.ok:
        return False
    tag = resume_tag(me)
    # a resume tag stays while the view's entry of me is a failed run with attempts
    live_tag = done is not None and done.attempts > 0
    at = [
        (i, ":me" if e.get("S") == me else ":tag")
        for i, e in enumerate(lease.done)
        if e.get("S") == me or (not live_tag and e.get("B") == tag)
    ][:32]
    if not at:
        return False
    elements = ", ".join(DONE_ELEMENT.format(index=i) for i, _ in at)
    # If d moved on (a prune) this refuses; the caller reads again either way.
    with contextlib.suppress(ConditionFailed):
        table.update(
            key,
            FORGET_UPDATE.format(elements=elements),
            " AND ".join(DONE_ELEMENT_IS.format(index=i, value=value) for i, value in at),
            {":me": me, ":tag": tag},
        )
    return True


def _append(
    table: Table,
    key: str,
    me: str,
    ref: str,
    cutoff: int,
    max_queue: int,
    *,
    halted: bool = False,
    resumed: tuple[Lease, int] | None = None,
) -> LeaseResult | Lease:
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
    values: dict[str, object] = {
        ":me": me,
        ":tag": resume_tag(me),
        ":id": [me],
        ":ref": [ref],
        ":empty": [],
        ":zero": 0,
        ":max": max_queue,
        ":shard": table.shard(key),
        ":cutoff": cutoff,
    }
    version: str | None = None
    if resumed is None:
        update = APPEND_HALTED_UPDATE if halted else APPEND_UPDATE
        condition = APPEND_HALTED_CONDITION if halted else APPEND_CONDITION
    else:
        snapshot, attempts = resumed
        update = APPEND_HALTED_RESUMED_UPDATE if halted else APPEND_RESUMED_UPDATE
        condition = snapshot.pinned(
            APPEND_HALTED_RESUMED_CONDITION if halted else APPEND_RESUMED_CONDITION, values
        )
        version = new_nonce()
        values.update({":v": version, ":a": {**snapshot.attempts, me: attempts}})
    try:
        new = Lease.parse(table.update(key, update, condition, values, returns="ALL_NEW"))
    except ConditionFailed as failed:
        if version is None or failed.lease.version != version:
            return failed.lease  # a resend of an applied append is recognised by the caller
        new = failed.lease  # a botocore resend of this very append, applied earlier
    position = new.queue.index(me) + 1 if me in new.queue else len(new.queue)
    if halted:
        return LeaseResult(False, None, None, position=position)
    return LeaseResult(False, new.owner, new.token, position=position)


def _requeue_halted(
    table: Table, key: str, lease: Lease, extra: tuple[str, str], cutoff: int, resume: int = 0
) -> LeaseResult | Lease:
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
    for sid in lease.started():  # [G5] only runs that started count
        attempts[sid] = attempts.get(sid, 0) + 1
    values: dict[str, object] = {}
    condition = lease.pinned(REQUEUE_HALTED_CONDITION, values)
    version = new_nonce()
    values.update({":cutoff": cutoff, ":v": version, ":q": ids, ":qn": refs, ":a": attempts})
    try:
        table.update(key, REQUEUE_HALTED_UPDATE, condition, values)
    except ConditionFailed as failed:
        if failed.lease.version != version:  # else: a resend of this write, applied
            return failed.lease
    return LeaseResult(False, None, None, position=ids.index(extra[0]) + 1)
