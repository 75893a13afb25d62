"""The simulator's checker fails on broken providers and passes on real ones."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from leaseguard.config import ProviderConfig
from leaseguard.contract import LeaseResult
from leaseguard.providers.memory import InMemoryLeaseProvider
from leaseguard.signals import Signal
from leaseguard.simulate.checker import check
from leaseguard.simulate.engine import Simulation, SimulationConfig
from leaseguard.simulate.summary import summarize


def simulate(provider: InMemoryLeaseProvider, **options: object) -> tuple[object, object]:
    config = SimulationConfig(
        ProviderConfig(backend="memory"),
        **{
            "workers": 4,
            "invocations": 150,
            "keys": 2,
            "work_ms": (2, 8),
            "threads": True,
            "quiesce_timeout_s": 30,
            **options,
        },  # type: ignore[arg-type]
    )
    result = Simulation(config, provider=provider).run()
    return result, check(result.records, [e["id"] for e in result.events])


class TwoOwners(InMemoryLeaseProvider):
    """Grants a held key to every third newcomer as well, with a made-up lower token."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.guard = threading.Lock()

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        with self.guard:
            self.calls += 1
            rogue = self.calls % 3 == 0
        result = super()._acquire_or_enqueue(key, signal, record, ttl_ms, max_queue)
        if not result.acquired and rogue and result.position:
            return LeaseResult(True, signal.id, 1)  # "you own it too"
        return result


class DropsSignals(InMemoryLeaseProvider):
    """Says it queued every fourth forwarded signal but throws it away."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        held = self.get_lease_owner(key)
        self.calls += 1
        if held is not None and held != signal.id and self.calls % 4 == 0:
            return LeaseResult(False, held, None, position=1)
        return super()._acquire_or_enqueue(key, signal, record, ttl_ms, max_queue)


class Reorders(InMemoryLeaseProvider):
    """Serves the queue newest first."""

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        result = super()._acquire_or_enqueue(key, signal, record, ttl_ms, max_queue)
        if not result.acquired and result.position:
            with self._lock:
                queue = self._keys[key].queue
                queue.insert(0, queue.pop())  # jump the queue
        return result


@pytest.mark.parametrize(
    ("broken", "expected"),
    [(TwoOwners, "overlap"), (DropsSignals, "lost"), (Reorders, "fifo")],
    ids=["two-owners", "drops-signals", "reorders"],
)
def test_checker_catches_a_broken_provider(
    broken: type[InMemoryLeaseProvider], expected: str
) -> None:
    _, report = simulate(broken(), drain=0)
    kinds = report.by_kind()  # type: ignore[attr-defined]
    assert kinds[expected] > 0, kinds
    assert not report.ok  # type: ignore[attr-defined]


def test_two_owners_also_breaks_fencing() -> None:
    _, report = simulate(TwoOwners(), drain=0)
    assert report.by_kind()["token"] > 0  # type: ignore[attr-defined]


def test_checker_passes_on_the_real_memory_provider() -> None:
    result, report = simulate(InMemoryLeaseProvider())
    assert report.ok, report.violations  # type: ignore[attr-defined]
    summary = summarize(result, report)  # type: ignore[arg-type]
    assert summary.invocations == 150 and summary.handled == 150
    assert summary.forwarded > 0 and summary.acquired > 0


def test_kills_are_survived_and_explained_on_redis(redis_url: str) -> None:
    config = SimulationConfig(
        ProviderConfig(backend="redis", redis_url=redis_url, key_prefix="sim-kill:"),
        workers=4,
        invocations=150,
        keys=3,
        work_ms=(5, 20),
        kill_rate=0.05,
        ttl_ms=500,
        sweep_every_ms=100,
        seed=3,
    )
    result = Simulation(config).run()
    assert result.quiesced, result.stuck
    report = check(result.records, [e["id"] for e in result.events])
    assert report.ok, report.violations
    assert result.kills > 0
    assert min(report.handled[e["id"]] for e in result.events) >= 1  # nothing lost
    statuses = Counter(r["status"] for r in result.records if r["type"] == "invoke")
    assert statuses["error"] == 0
