"""The lease contract: [L1]-[L5] acquire and release, [R1] [R2] renew, [T1]-[T3] transfer."""

from __future__ import annotations

from typing import Any

from leaseguard.errors import LeaseBackendError
from leaseguard.providers.base import new_nonce
from leaseguard.types import LeaseResult

from .complete import Then, complete
from .contention import optimistic_tries, unsettled
from .expressions import (
    ACQUIRE_CONDITION,
    ACQUIRE_UPDATE,
    EXTEND_UPDATE,
    IDLE_OWNER,
    RELEASE_UPDATE,
    RENEW_CONDITION,
    RENEW_GRANT_CONDITION,
    TAKE_OVER_CONDITION,
    TAKE_OVER_UPDATE,
    TRANSFER_UPDATE,
)
from .io import ConditionFailed, Retry, Table
from .schema import Lease, number_of


def acquire(table: Table, key: str, owner: str, ttl_ms: int) -> LeaseResult:
    old: Lease | None = None
    for _ in optimistic_tries():
        now, cutoff = table.times()
        version = new_nonce()
        try:
            if old is not None and old.in_flight and old.free_for(owner, now, cutoff):
                attrs = _take_over_in_flight(table, key, old, owner, ttl_ms, version, now, cutoff)
            else:
                # [L3] free (or our own expired lease) with nothing in flight: a new grant
                # in one blind write. No grant nonce ([G3] nonce=None). A dead owner's
                # in-flight signals make it refuse: [G5] counts an attempt for each, which
                # needs their ids (the refusal's ALL_OLD has them).
                attrs = table.update(
                    key,
                    ACQUIRE_UPDATE,
                    ACQUIRE_CONDITION,
                    {
                        ":me": owner,
                        ":exp": now + ttl_ms,
                        ":floor": now * 1000,
                        ":one": 1,
                        ":zero": 0,
                        ":true": True,
                        ":v": version,
                        ":ttl": table.ttl(now + ttl_ms),
                        ":now": now,
                        ":cutoff": cutoff,
                    },
                    returns="UPDATED_NEW",
                )
            return LeaseResult(True, owner, number_of(attrs, "t"))
        except ConditionFailed as failed:
            old = failed.lease
        if old.version == version:  # a botocore resend of the grant above, applied earlier
            return LeaseResult(True, owner, old.token)
        if old.live_owner(owner, now) and old.token is not None:  # [L1] the owner again
            refused = _extend(table, key, owner, ttl_ms, old.token)
            if refused is None:
                return LeaseResult(True, owner, old.token)  # same token, new deadline
            if refused.live_grant(owner, table.times()[0], old.token):
                # refused for its send order alone, asking further than the deadline reaches
                raise LeaseBackendError(
                    f"acquire_lease of {key!r} by {owner!r} was refused: the lease's deadline"
                    " was last set by a request sent later, by its sender's clock, than this"
                    " one (a clock stepped back, or one owner name on two machines); the"
                    " deadline is left as that request set it"
                )
            old = None  # expired or taken meanwhile: look again
            continue
        if not old.free_for(owner, now, cutoff):  # [L2] refused, naming the holder
            return LeaseResult(False, old.holder(cutoff), old.token)
    raise unsettled("acquire", key, old)


def _take_over_in_flight(
    table: Table,
    key: str,
    lease: Lease,
    owner: str,
    ttl_ms: int,
    version: str,
    now: int,
    cutoff: int,
) -> dict[str, Any]:
    """[L3] with a dead owner's signals in flight: [G5] they go back to the head of the
    queue, each with one more attempt (the key stays in the orphan index), and [G3] the
    new grant. Conditional on the snapshot (its version; appends at the tail allowed)."""
    values: dict[str, object] = {}
    condition = lease.pinned(TAKE_OVER_CONDITION, values)
    attempts = dict(lease.attempts)
    for sid in lease.started():  # [G5] only runs that started count
        attempts[sid] = attempts.get(sid, 0) + 1
    values.update(
        {
            ":me": owner,
            ":exp": now + ttl_ms,
            ":floor": now * 1000,
            ":one": 1,
            ":true": True,
            ":v": version,
            ":ttl": table.ttl(now + ttl_ms),
            ":now": now,
            ":cutoff": cutoff,
            ":empty": [],
            ":rq": list(lease.in_flight),
            ":rqn": list(lease.in_flight_refs),
            ":a": attempts,
        }
    )
    return table.update(key, TAKE_OVER_UPDATE, condition, values, returns="UPDATED_NEW")


def _extend(table: Table, key: str, owner: str, ttl_ms: int, token: int | None) -> Lease | None:
    """[R1] / [L1] The holder's new deadline (of exactly the grant ``token`` when given). None
    when applied, or when refused for its send order alone (IN_SEND_ORDER) with the deadline
    already reaching as far as asked: held at least that long. Else the item (ALL_OLD)."""
    now, _ = table.times()
    try:
        table.update(
            key,
            EXTEND_UPDATE,
            RENEW_CONDITION if token is None else RENEW_GRANT_CONDITION,
            {
                ":me": owner,
                ":exp": now + ttl_ms,
                ":ttl": table.ttl(now + ttl_ms),
                ":now": now,
                ":grant": token,
            },
        )
    except ConditionFailed as failed:
        held = failed.lease
        return None if held.live_grant(owner, now, token) and held.expiry >= now + ttl_ms else held
    return None


def get_owner(table: Table, key: str) -> str | None:
    _, cutoff = table.times()
    return table.read(key).holder(cutoff)


def release(table: Table, key: str, owner: str) -> None:
    now, _ = table.times()
    version = new_nonce()
    try:
        # [L4] with nothing in flight (a plain lease): [G7] free in one blind write. The
        # queue, if any, stays for the sweeper (gx = 0). See docs/dynamodb.md: a plain
        # owner's id is not added to the completed-id memory.
        table.update(
            key,
            RELEASE_UPDATE,
            IDLE_OWNER,
            {":me": owner, ":v": version, ":zero": 0, ":ttl": table.ttl(now), ":now": now},
        )
        return
    except ConditionFailed as failed:
        lease = failed.lease
    for _ in optimistic_tries():
        now, _ = table.times()
        if lease.version == version or not lease.live_owner(owner, now):
            return  # [L5] not the owner (or a resend of a release that was applied)
        # [L4] signals in flight: [G6] complete them, then [G7] free.
        outcome = complete(table, key, lease, owner, now, None, Then("free"))
        if not isinstance(outcome, Retry):
            return
        lease = outcome.lease or table.read(key)
    raise unsettled("release", key, lease)


def renew(table: Table, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
    # [R1] the holder (of exactly this grant) extends; [R2] never revives an expired one. A
    # refusal for the send order alone with the deadline short of what was asked is False:
    # fail-safe, the caller stops relying on the lease.
    return _extend(table, key, owner, ttl_ms, token) is None


def transfer(table: Table, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
    now, cutoff = table.times()
    version = new_nonce()
    try:
        # [T1] with nothing in flight: [G6] has nothing to complete; the grant ([G3],
        # nonce None, prev = from_owner) in one blind write.
        table.update(
            key,
            TRANSFER_UPDATE,
            IDLE_OWNER,
            {
                ":me": from_owner,
                ":to": to_owner,
                ":exp": now + ttl_ms,
                ":one": 1,
                ":zero": 0,
                ":true": True,
                ":v": version,
                ":ttl": table.ttl(now + ttl_ms),
                ":now": now,
            },
        )
        return True
    except ConditionFailed as failed:
        lease = failed.lease
    for _ in optimistic_tries():
        now, cutoff = table.times()
        if lease.version == version:
            return True  # a botocore resend of the write above, applied earlier
        if lease.holder(cutoff) == to_owner and lease.previous == from_owner:
            return True  # [T3] a resend of a transfer that was applied
        if not lease.live_owner(from_owner, now):
            return False  # [T2]
        # [T1] signals in flight: [G6] complete them, then the grant.
        then = Then("to", ttl_ms=ttl_ms, to_owner=to_owner)
        outcome = complete(table, key, lease, from_owner, now, None, then)
        if not isinstance(outcome, Retry):
            return True
        lease = outcome.lease or table.read(key)
    raise unsettled("transfer", key, lease)
