"""Row G8, the partial report of ``transfer_to_next``, on every backend (``provider`` fixture).

A batch drain runs the signals it took one by one; when one fails, those before it succeeded
and those after it never ran. The report names the ones that ran and the one that failed;
everything else in flight goes back to the head of the queue with its count unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest

from leaseguard import Signal
from leaseguard.errors import InvalidLeaseArgument
from leaseguard.providers.base import BaseLeaseProvider

TTL = 30_000
KEY = "partial"


def queued(provider: BaseLeaseProvider, key: str = KEY) -> list[tuple[str, int]]:
    return [(s.id, s.attempts) for s in provider.inspect_key(key).queued]


def owner_with_batch(provider: BaseLeaseProvider, key: str = KEY) -> int:
    """``a`` owns ``key`` with ``b``, ``c`` and ``d`` taken and ``e`` queued; its token."""
    grant = provider.acquire_or_enqueue(key, Signal("a", {"n": "a"}), TTL)
    assert grant.acquired and grant.token is not None
    for sid in "bcde":
        assert not provider.acquire_or_enqueue(key, Signal(sid, {"n": sid}), TTL).acquired
    taken = provider.take_signals(key, "a", 3, token=grant.token)
    assert [s.id for s in taken] == ["b", "c", "d"]
    return grant.token


def test_completed_ids_are_done_the_failed_one_retried_first_the_rest_requeued_unrun(
    provider: BaseLeaseProvider,
) -> None:
    token = owner_with_batch(provider)
    nxt = provider.transfer_to_next(
        KEY, "a", TTL, token=token, error="boom", completed=["a", "b"], failed=["c"]
    )
    # the failed one first (one attempt more), then the one that never ran, then the queue
    assert nxt is not None and (nxt.id, nxt.attempts, nxt.payload) == ("c", 1, {"n": "c"})
    assert nxt.token is not None and nxt.token > token
    state = provider.inspect_key(KEY)
    assert (state.owner, state.in_flight) == ("c", ("c",))
    assert queued(provider) == [("d", 0), ("e", 0)]
    # the completed ones are remembered: a redelivery of either runs nothing
    for sid in "ab":
        again = provider.acquire_or_enqueue(KEY, Signal(sid, {"n": sid}), TTL)
        assert not again.acquired and again.position is None
    assert queued(provider) == [("d", 0), ("e", 0)]


def test_a_resent_partial_report_is_answered_with_the_same_grant(
    provider: BaseLeaseProvider,
) -> None:
    token = owner_with_batch(provider)
    report: dict[str, Any] = {"error": "boom", "completed": ["a"], "failed": ["b"]}
    first = provider.transfer_to_next(KEY, "a", TTL, token=token, **report)
    again = provider.transfer_to_next(KEY, "a", TTL, token=token, **report)
    assert first is not None and again is not None
    assert (again.id, again.token) == (first.id, first.token) == ("b", first.token)
    assert queued(provider) == [("c", 0), ("d", 0), ("e", 0)]


def test_a_report_of_runs_only_requeues_what_never_ran(provider: BaseLeaseProvider) -> None:
    # the drain's take_signals failed after it moved b, c and d: only a ran
    token = owner_with_batch(provider)
    nxt = provider.transfer_to_next(KEY, "a", TTL, token=token, completed=["a"])
    assert nxt is not None and (nxt.id, nxt.attempts) == ("b", 0)
    assert queued(provider) == [("c", 0), ("d", 0), ("e", 0)]


def test_the_last_failure_of_a_batch_signal_dead_letters_it_and_the_key_moves_on(
    provider: BaseLeaseProvider,
) -> None:
    token = owner_with_batch(provider)
    nxt = provider.transfer_to_next(
        KEY,
        "a",
        TTL,
        token=token,
        error="poison",
        completed=["a"],
        failed=["b"],
        max_attempts=1,
    )
    assert nxt is not None and (nxt.id, nxt.attempts) == ("c", 0)
    state = provider.inspect_key(KEY)
    assert [(d.id, d.attempts, d.error) for d in state.dead_letters] == [("b", 1, "poison")]
    assert queued(provider) == [("d", 0), ("e", 0)]


def test_an_owner_that_did_not_complete_is_not_deduplicated(provider: BaseLeaseProvider) -> None:
    token = owner_with_batch(provider)
    nxt = provider.transfer_to_next(KEY, "a", TTL, token=token, completed=["b", "c", "d"])
    # a, named in neither list, never ran: back to the head, and the next owner
    assert nxt is not None and (nxt.id, nxt.attempts) == ("a", 0)
    assert queued(provider) == [("e", 0)]


BAD_REPORTS: list[tuple[dict[str, Any], str]] = [
    ({"failed": ["b"], "error": "x"}, "needs completed="),
    ({"completed": ["a"], "failed": ["b"]}, "needs error="),
    ({"completed": ["a", "b"], "failed": ["b"], "error": "x"}, "both completed and failed"),
    ({"completed": "ab"}, "list or tuple"),
    ({"completed": ["a", "a"]}, "names an id twice"),
    ({"completed": ["a", ""]}, "completed"),
    ({"completed": ["a", 7]}, "completed"),
    ({"completed": ["a"], "token": None}, "needs token="),
]


@pytest.mark.parametrize(("report", "why"), BAD_REPORTS, ids=[w for _, w in BAD_REPORTS])
def test_a_malformed_partial_report_is_refused_and_changes_nothing(
    provider: BaseLeaseProvider, report: dict[str, Any], why: str
) -> None:
    token = owner_with_batch(provider)
    before = provider.inspect_key(KEY)
    arguments: dict[str, Any] = {"token": token, **report}
    with pytest.raises(InvalidLeaseArgument, match=why):
        provider.transfer_to_next(KEY, "a", TTL, **arguments)
    after = provider.inspect_key(KEY)
    assert (after.owner, after.in_flight, after.queued) == (
        before.owner,
        before.in_flight,
        before.queued,
    )
