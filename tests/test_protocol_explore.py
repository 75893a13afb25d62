"""The model checker's own contract: it explores, it reports, and it is not vacuous.

``make model-check`` (and its small bound in ``make test``) is the real run; these tests pin
what it prints and that a broken model fails it with a readable shortest trace.
"""

from __future__ import annotations

import pytest

from leaseguard.protocol.explore import (
    FAMILIES,
    PRESETS,
    Bounds,
    Explorer,
    check_model,
    check_mutant,
    main,
)
from leaseguard.protocol.mutants import MUTANTS, HandoffKeepsToken, ReadThenEnqueue

TINY = Bounds(events=2, faults=0, expiries=1, renews=0)


def test_the_correct_model_has_no_violation_at_a_tiny_bound() -> None:
    result = check_model(TINY)
    assert result.violations == 0 and result.states > 1_000 and result.transitions > result.states


def test_a_broken_model_fails_with_its_shortest_trace() -> None:
    result = Explorer(TINY, HandoffKeepsToken()).run()
    assert result.violations == 1
    assert result.message is not None and result.message.startswith("(b)")
    # breadth-first: two arrivals, a grant, a hand-off; nothing longer
    assert len(result.trace) == 4
    assert result.trace[0].startswith("event e1 arrives")


def test_the_cli_prints_the_counts_and_fails_below_the_required_states(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--bound", "small", "--faults", "0", "--no-mutants", "--min-states", "10000000"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "model-check: explored " in out and " 0 violations" in out
    assert "fewer than the required 10000000 states" in out


def test_there_are_at_least_five_mutants_and_they_have_distinct_names() -> None:
    assert len(MUTANTS) >= 5
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert any(m.model_class is ReadThenEnqueue for m in MUTANTS)


def test_the_queue_family_mutants_are_caught_with_the_invariant_they_break() -> None:
    """The bounded queue, halt and redrive rules are seen by the "queue" bounds (make test
    runs the full search; here each mutant stops at its first violation)."""
    expected = {
        "bound-ignored": "(j)",
        "halt-ignored": "(i)",
        "redrive-drops": "(h)",
        "redrive-resend-unrecognised": "(h)",
        "guard-full-forward-dropped": "(c)",
    }
    queue_mutants = {m.name: m for m in MUTANTS if m.family == "queue"}
    assert set(queue_mutants) == set(expected)
    for name, invariant in expected.items():
        mutant = queue_mutants[name]
        found = check_mutant(PRESETS["queue"], mutant)
        assert found.violations == 1, name
        assert found.message is not None and found.message.startswith(invariant), found.message


def test_the_dead_letter_bound_holds_and_its_mutants_are_caught() -> None:
    """Row G6's bound (invariant (n)) at the "dead" bound: the model holds it, and each mutant
    of the rule breaks the invariant named (the dropped overflow is a lost event, (c))."""
    assert check_model(PRESETS["dead"]).violations == 0
    expected = {"dead-past-bound": "(n)", "dead-overflow-dropped": "(c)"}
    expected["dead-overflow-not-halted"] = "(n)"
    dead_mutants = {m.name: m for m in MUTANTS if m.family == "dead"}
    assert set(dead_mutants) == set(expected)
    for name, invariant in expected.items():
        found = check_mutant(PRESETS["dead"], dead_mutants[name])
        assert found.message is not None and found.message.startswith(invariant), found.message


def test_the_explorer_runs_the_guards_own_flow() -> None:
    """Every invocation the explorer moves is leaseguard.guard's Invocation.flow, driven by
    the sync driver that ships: counting its calls during a tiny search finds them."""
    from leaseguard.guard import flow

    original = flow.Invocation.flow
    calls = 0

    def counted(self: flow.Invocation) -> flow.Flow:
        nonlocal calls
        calls += 1
        return original(self)

    flow.Invocation.flow = counted  # type: ignore[method-assign]
    try:
        result = check_model(TINY)
    finally:
        flow.Invocation.flow = original  # type: ignore[method-assign]
    assert result.violations == 0
    assert calls > result.states / 10


def test_guard_mutants_are_caught_by_the_model_check() -> None:
    """Mutants of leaseguard/guard/ itself (its source edited, as a bug would edit it) fail the
    search of a bound that can see them, with the invariant they break."""
    expected = {
        "guard-ttl-clock-from-reply": ("small", "(a)"),
        "guard-failed-run-reported-ok": ("small", "(c)"),
        # its failure report charges the signal the failed take moved in flight unseen, and the
        # next hand-off runs it at once: (o) fires before (c) finds it lost or (l) overcharged
        "guard-failed-take-completes": ("small", "(o)"),
        "guard-retry-runs-at-once": ("small", "(o)"),
        "guard-retry-delay-unjittered-low": ("small", "(o)"),
        "guard-own-failure-swallowed": ("small", "(c)"),
    }
    guard_mutants = {m.name: m for m in MUTANTS if m.source is not None}
    assert len(guard_mutants) >= 3
    assert all(m.source.module.startswith("leaseguard.") for m in guard_mutants.values())
    for name, (bound, invariant) in expected.items():
        mutant = guard_mutants[name]
        assert mutant.family in FAMILIES[bound]
        found = check_mutant(PRESETS[bound], mutant)
        assert found.violations == 1, name
        assert found.message is not None and found.message.startswith(invariant), found.message


def test_a_source_mutant_is_undone_after_its_search() -> None:
    from leaseguard.guard import drivers, flow

    before = (flow.Invocation, drivers.Invocation)
    mutant = next(m for m in MUTANTS if m.name == "guard-failed-run-reported-ok")
    with mutant.applied():
        assert flow.Invocation is not before[0] and drivers.Invocation is flow.Invocation
    assert (flow.Invocation, drivers.Invocation) == before
    assert check_model(TINY).violations == 0


def test_a_waiting_callers_owner_answers_before_anyone_elses_run() -> None:
    """Invariant (p) over owners whose caller waits (``caller_waits=True``, as an API Gateway
    request): the guard hands off what is queued behind the own event, and a guard that drained
    it inline instead is caught."""
    waiting = Bounds(events=2, faults=0, expiries=1, renews=0, caller_waits=True)
    assert check_model(waiting).violations == 0
    mutant = next(m for m in MUTANTS if m.name == "guard-waiting-caller-drains-inline")
    assert mutant.family in FAMILIES["waiting"]
    found = check_mutant(waiting, mutant)
    assert found.violations == 1
    assert found.message is not None and found.message.startswith("(p)"), found.message
