"""What a simulation is asked to do (:class:`SimulationConfig`, and the events it plans from
it), what travels from the coordinator to a worker (:class:`Delivery`), and what it reports
(:class:`SimulationResult`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from leaseguard.config import ProviderConfig

Record = dict[str, Any]
MAX_ERROR_RETRIES = 3  # like Lambda's async retries: a delivery that keeps failing is dropped


@dataclass(frozen=True)
class SimulationConfig:
    provider: ProviderConfig
    workers: int = 4
    invocations: int = 400
    keys: int = 6
    work_ms: tuple[int, int] = (5, 40)
    ttl_ms: int = 1_000
    kill_rate: float = 0.0
    drain: int = 2  # the handler's own take_signals(drain) after its work
    drain_batch: int = 0  # the decorator's drain_batch (batches under one grant, row G8)
    burst: int = 8
    gap_ms: int = 40
    lambda_timeout_ms: int = 1_500
    handoff_margin_ms: int = 1_000
    sweep_every_ms: int = 200
    threads: bool = False
    seed: int = 1
    quiesce_timeout_s: float = 120.0
    # Random kills are not poison: each run an event's owner dies in counts as a failed attempt
    # (docs/protocol.md, G5), and at the default 3 an unlucky event would be dead-lettered, not
    # handled. The checker's promise is "every event handled", so the bound is high here.
    max_attempts: int = 100

    def __post_init__(self) -> None:
        if self.workers < 1 or self.invocations < 1 or self.keys < 1:
            raise ValueError("workers, invocations and keys must be at least 1")
        low, high = self.work_ms
        if not 0 <= low <= high:
            raise ValueError("work_ms must be (min, max) with 0 <= min <= max")
        if not 0 <= self.drain_batch <= 1_000:
            raise ValueError("drain_batch must be in [0, 1000]")
        if not 0.0 <= self.kill_rate < 1.0:
            raise ValueError("kill_rate must be in [0, 1)")
        if self.threads and self.kill_rate:
            raise ValueError("kill_rate needs worker processes; threads cannot be SIGKILLed")
        if self.provider.backend == "memory" and not self.threads:
            raise ValueError("the memory backend lives in one process: use threads")


@dataclass(frozen=True)
class Delivery:
    """One delivery of an invocation to a worker. ``attempt`` counts platform retries."""

    index: int
    kind: str  # event | handoff (an async Invoke by a handler) | sweep (sent by the sweeper)
    body: dict[str, Any]
    attempt: int = 0

    @property
    def invocation(self) -> str:
        return f"i{self.index}/{self.attempt}"


@dataclass
class SimulationResult:
    config: SimulationConfig
    records: list[Record]
    events: list[dict[str, Any]]
    started_ns: int
    finished_ns: int
    quiesced: bool
    stuck: dict[str, Any] = field(default_factory=dict)  # keys still busy when it gave up
    unfinished: list[str] = field(default_factory=list)  # invocations it still waited for
    adopted: int = 0
    kills: int = 0

    @property
    def wall_s(self) -> float:
        return (self.finished_ns - self.started_ns) / 1e9


def plan_events(config: SimulationConfig) -> list[tuple[float, dict[str, Any]]]:
    """(arrival offset in seconds, event) pairs: bursts of events that favour a few hot keys,
    separated by random gaps."""
    rng = random.Random(config.seed)
    planned: list[tuple[float, dict[str, Any]]] = []
    clock = 0.0
    while len(planned) < config.invocations:
        size = min(
            1 + int(rng.expovariate(1 / max(config.burst - 1, 1))),
            config.invocations - len(planned),
        )
        for _ in range(size):
            key = min(int(rng.expovariate(3 / config.keys)), config.keys - 1)
            n = len(planned)
            planned.append(
                (
                    clock + rng.random() * 0.002,
                    {
                        "id": f"e{n:05d}",
                        "key": f"key-{key}",
                        "work_ms": rng.randint(*config.work_ms),
                    },
                )
            )
        clock += rng.random() * 2 * config.gap_ms / 1000
    return planned
