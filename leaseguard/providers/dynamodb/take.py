"""The owner's side of the signal queue: [K1]-[K3] take_signals and [N1]-[N5] transfer_to_next."""

from __future__ import annotations

from collections.abc import Mapping

from leaseguard.errors import LeaseBackendError, LeaseLostError
from leaseguard.protocol.model import Failure
from leaseguard.providers.base import new_nonce
from leaseguard.signals import decode_signal
from leaseguard.types import Signal

from .complete import Then, complete, prune, remember, with_attempts
from .contention import optimistic_tries, unsettled
from .done import done_view, marker
from .expressions import (
    COMPLETE_CONDITION,
    QUEUE_ELEMENT,
    RELEASE_IDLE_CONDITION,
    RELEASE_IDLE_GRANT_CONDITION,
    RELEASE_IDLE_UPDATE,
    REPORT_KEPT_SETS,
    REPORT_NONE_KEPT_REMOVES,
    TAKE_CONDITION,
    TAKE_UPDATE,
)
from .io import ConditionFailed, Retry, Table
from .schema import OPTIMISTIC_ATTEMPTS, Lease, strings_of

# A take moves at most this many signals per write: an UpdateExpression is limited to 4 KB,
# which would allow about 200; 64 because moto's expression parser recurses once per element
# and fails past about 70 under Python's default recursion limit, and the tests run on moto.
_TAKE_BATCH = 64


def take(
    table: Table,
    key: str,
    owner: str,
    limit: int,
    token: int | None = None,
    completed: tuple[str, ...] = (),
) -> list[Signal]:
    # the item as the report left it: the take's first try starts from it
    seen = report_completed(table, key, owner, token, completed) if completed else None
    taken_ids: list[str] = []
    taken_refs: list[str] = []
    attempts: Mapping[str, int] = {}
    tries = 0
    while len(taken_ids) < limit:
        tries += 1
        if tries > OPTIMISTIC_ATTEMPTS + limit // _TAKE_BATCH:
            raise LeaseBackendError(f"take_signals on {key!r} did not settle")
        now, cutoff = table.times()
        lease, seen = seen or table.read(key), None
        if not lease.live_grant(owner, now, token):
            if taken_ids:
                break  # what we moved is in flight for us; adopt re-delivers it if we died
            raise LeaseLostError(key, owner, lease.holder(cutoff))  # [K3]
        attempts = lease.attempts
        n = min(limit - len(taken_ids), len(lease.queue), _TAKE_BATCH)
        if n == 0:
            break
        ids, refs = lease.queue[:n], lease.queue_refs[:n]
        nonce = new_nonce()
        heads = ", ".join(QUEUE_ELEMENT.format(index=i) for i in range(n))
        try:
            # [K1] the head of the queue moves to the owner's in-flight list
            table.update(
                key,
                TAKE_UPDATE.format(heads=heads),
                TAKE_CONDITION,
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
                    ":v": new_nonce(),
                },
            )
        except ConditionFailed as failed:
            if failed.lease.take_nonce != nonce:  # [K2] else: our batch, applied earlier
                continue
        taken_ids += ids
        taken_refs += refs
        if n == len(lease.queue):
            break  # we took all there was; later arrivals wait for the next call
    payloads = table.payloads(key, taken_refs)
    return [
        decode_signal(signal_id, payloads[ref], None, attempts.get(signal_id, 0))
        for signal_id, ref in zip(taken_ids, taken_refs, strict=True)
        if ref in payloads
    ]


def report_completed(
    table: Table, key: str, owner: str, token: int | None, completed: tuple[str, ...]
) -> Lease | None:
    """[K1] the in-flight signals named in ``completed`` (they ran and succeeded since the last
    report) are done before the next ones are taken: out of the in-flight list, remembered as
    completed ([G2]) under the grant's token, their payloads deleted. One write, conditional on
    the snapshot it was computed from (the live grant, its version); a crash after it neither
    runs nor charges them again ([G5]). A separate write from the take that follows: a take
    moves at most _TAKE_BATCH signals per write anyway, and a reply lost between the two
    leaves the report applied once (the resend finds nothing of it in flight).

    Returns the item as the report left it (its ALL_NEW image, or the read that found nothing
    to report), for the take to start from without reading it again; None after a resend."""
    reported = set(completed)
    lease: Lease | None = None
    for _ in optimistic_tries():
        now, cutoff = table.times()
        lease = table.read(key)
        if not lease.live_grant(owner, now, token) or lease.token is None:
            raise LeaseLostError(key, owner, lease.holder(cutoff))  # [K3]
        pairs = list(zip(lease.in_flight, lease.in_flight_refs, strict=False))
        done_pairs = [(sid, ref) for sid, ref in pairs if sid in reported]
        if not done_pairs:
            return lease  # nothing of it in flight (a resend of an applied report, or none ran)
        kept = [(sid, ref) for sid, ref in pairs if sid not in reported]
        attempts = {sid: n for sid, n in lease.attempts.items() if sid not in reported}
        version = new_nonce()
        values: dict[str, object] = {}
        condition = lease.pinned(COMPLETE_CONDITION, values)
        values.update({":me": owner, ":now": now, ":tok": lease.token, ":v": version, ":empty": []})
        sets: list[str] = ["#v = :v"]
        removes: list[str] = []
        if kept:
            sets += REPORT_KEPT_SETS
            values[":kf"] = [sid for sid, _ in kept]
            values[":kfn"] = [ref for _, ref in kept]
        else:
            removes += REPORT_NONE_KEPT_REMOVES
        entries = [*(sid for sid, _ in done_pairs), marker(now, lease.token, True)]
        remember(sets, values, lease, entries, now)
        update = with_attempts(sets, removes, values, attempts)
        after: Lease | None = None
        try:
            after = Lease.parse(table.update(key, update, condition, values, returns="ALL_NEW"))
        except ConditionFailed as failed:
            if failed.lease.version != version:  # else: a resend of this write, applied
                continue
        table.delete_signals(key, [ref for _, ref in done_pairs])
        return after
    raise unsettled("take_signals", key, lease)


def transfer_to_next(
    table: Table,
    key: str,
    owner: str,
    ttl_ms: int,
    claim: bool,
    token: int | None = None,
    failure: Failure | None = None,
) -> Signal | None:
    lease: Lease | None = None
    if failure is None:
        # Most owners finish with nothing queued, so first try [G6] + [N1] in one write,
        # conditional on the queue being empty (a forwarder that appended meanwhile makes
        # it fail: no lost wakeup). A refusal's ALL_OLD image is the consistent snapshot
        # the hand-off works from, so no separate read is needed.
        released = _release_if_idle(table, key, owner, token)
        if released is None:
            return None
        lease = released
    for _ in optimistic_tries():
        now, cutoff = table.times()
        if lease is None:
            lease = table.read(key)
        if not lease.live_grant(owner, now, token):
            return _not_holding(table, key, lease, owner, token, now, cutoff)
        outcome = complete(table, key, lease, owner, now, failure, Then("next", ttl_ms, claim))
        if not isinstance(outcome, Retry):
            return outcome if isinstance(outcome, Signal) else None
        lease = outcome.lease
    raise unsettled("transfer_to_next", key, lease)


def _not_holding(
    table: Table, key: str, lease: Lease, owner: str, token: int | None, now: int, cutoff: int
) -> Signal | None:
    """[N4] a resend of a step that was applied (we handed over or released last, or our
    grant is remembered as completed), else [N5] LeaseLostError."""
    if lease.previous == owner and (token is None or lease.prev_token == token):
        holder = lease.holder(cutoff)
        if holder is None:
            return None  # we released it
        if holder in lease.in_flight:  # the head our hand-off granted
            return table.stored_signal(key, lease, holder, lease.token)
        # moved by transfer_lease, not by our hand-off: the done memory decides
    done = done_view(lease.done, now).get(owner)
    if token is not None and done is not None and done.token == token:
        return None
    raise LeaseLostError(key, owner, lease.holder(cutoff))


def _release_if_idle(table: Table, key: str, owner: str, token: int | None) -> Lease | None:
    """[G6] + [N1] for a signal owner (its own signal heads the in-flight list) with nothing
    queued, in one write: every in-flight signal and the owner are remembered as completed
    (``d``), the key is freed and leaves the index. Returns None when released, else the
    item as it stands (ALL_OLD)."""
    now, _ = table.times()
    version = new_nonce()
    try:
        old = table.update(
            key,
            RELEASE_IDLE_UPDATE,
            RELEASE_IDLE_CONDITION if token is None else RELEASE_IDLE_GRANT_CONDITION,
            {
                ":me": owner,
                ":now": now,
                ":zero": 0,
                ":one": 1,
                ":v": version,
                ":ttl": table.ttl(now),
                ":grant": token,
                ":empty": [],
                ":mark": [marker(now, token or 0, True)],
            },
            returns="ALL_OLD",
        )
    except ConditionFailed as failed:
        if failed.lease.version == version:  # a botocore resend of this very release
            return None
        return failed.lease
    completed = strings_of(old, "fn")
    if completed:
        table.delete_signals(key, completed)
    done = list(old["d"]["L"]) if "d" in old else []
    done += [{"S": sid} for sid in strings_of(old, "f")]
    done.append({"N": str(marker(now, token or 0, True))})
    prune(table, key, done, now)
    return None
