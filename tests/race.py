"""Multi-process race checks for any backend a :class:`ProviderConfig` describes.

Every worker is a real OS process with its own client. The checker is independent of the
provider: shared-memory counters guarded by one lock per key. A winner increments its key's
occupancy on entry (anything but 1 is an overlap) and compares its token with the last token
seen on that key (anything not greater is a regression); it decrements before releasing, so a
correct provider can never be blamed for the checker's own bookkeeping.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized, SynchronizedArray
from typing import Any

from leaseguard.config import ProviderConfig

_CTX = mp.get_context("fork")


@dataclass
class RaceReport:
    wins: int = 0
    refusals: int = 0
    overlaps: int = 0
    token_regressions: int = 0
    outsider_wins: int = 0
    failed_transfers: int = 0
    transfers: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return self.overlaps + self.token_regressions + self.outsider_wins + self.failed_transfers


def _lease_worker(
    config: ProviderConfig,
    worker: int,
    attempts: int,
    keys: int,
    ttl_ms: int,
    hold_s: float,
    occupancy: SynchronizedArray[int],
    last_token: SynchronizedArray[int],
    locks: list[Any],
    stats: SynchronizedArray[int],
    errors: Any,
) -> None:
    try:
        provider = config.build()
        rng = random.Random(worker)
        for attempt in range(attempts):
            k = rng.randrange(keys)
            key, owner = f"race-{k}", f"w{worker}-{attempt}"
            result = provider.acquire_lease(key, owner, ttl_ms)
            if not result.acquired:
                stats[1] += 1
                continue
            stats[0] += 1
            with locks[k]:
                occupancy[k] += 1
                if occupancy[k] != 1:
                    stats[2] += 1
                if result.token is None or result.token <= last_token[k]:
                    stats[3] += 1
                last_token[k] = result.token or 0
            time.sleep(hold_s * rng.random())
            with locks[k]:
                occupancy[k] -= 1
            provider.release_lease(key, owner)
    except Exception as exc:
        errors.put(f"worker {worker}: {type(exc).__name__}: {exc}")


def lease_race(
    config: ProviderConfig,
    *,
    processes: int = 8,
    attempts: int = 500,
    keys: int = 20,
    ttl_ms: int = 10_000,
    hold_s: float = 0.002,
    timeout_s: float = 300,
) -> RaceReport:
    """``processes`` x ``attempts`` acquire/hold/release cycles over ``keys`` keys."""
    occupancy = _CTX.Array("i", keys)
    last_token = _CTX.Array("q", keys)
    locks = [_CTX.Lock() for _ in range(keys)]
    errors = _CTX.Queue()
    all_stats = [_CTX.Array("q", 4) for _ in range(processes)]
    workers = [
        _CTX.Process(
            target=_lease_worker,
            args=(
                config,
                w,
                attempts,
                keys,
                ttl_ms,
                hold_s,
                occupancy,
                last_token,
                locks,
                all_stats[w],
                errors,
            ),
        )
        for w in range(processes)
    ]
    _run_all(workers, timeout_s)
    report = RaceReport()
    for stats in all_stats:
        report.wins += stats[0]
        report.refusals += stats[1]
        report.overlaps += stats[2]
        report.token_regressions += stats[3]
    report.errors = _drain(errors)
    return report


def _insider(
    config: ProviderConfig,
    key: str,
    transfers: int,
    ttl_ms: int,
    warm_attempts: int,
    started: Any,
    stop: Any,
    stats: SynchronizedArray[int],
    errors: Any,
) -> None:
    try:
        provider = config.build()
        owner = "insider-0"
        if not provider.acquire_lease(key, owner, ttl_ms).acquired:
            raise RuntimeError("insider could not take the key at the start")
        started.set()
        # Let the outsiders start hammering: each builds its client first (a Cluster client
        # discovers the nodes), which on a loaded machine took longer than a fixed 0.2 s sleep,
        # and the whole chain then ran before they tried at all.
        deadline = time.monotonic() + 30
        while stats[3] < warm_attempts and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(1, transfers + 1):
            nxt = f"insider-{i}"
            if provider.transfer_lease(key, owner, nxt, ttl_ms):
                owner = nxt
                stats[0] += 1
            else:
                stats[1] += 1
        # The key is not released: an outsider still between its stop check and its acquire
        # would win a free key and be counted as a violation. The lease just expires.
        stop.set()
    except Exception as exc:
        errors.put(f"insider: {type(exc).__name__}: {exc}")
        started.set()
        stop.set()


def _outsider(
    config: ProviderConfig,
    worker: int,
    key: str,
    ttl_ms: int,
    started: Any,
    stop: Any,
    stats: SynchronizedArray[int],
    errors: Any,
) -> None:
    try:
        provider = config.build()
        started.wait()
        n = 0
        while not stop.is_set():
            owner = f"outsider-{worker}-{n}"
            won = provider.acquire_lease(key, owner, ttl_ms).acquired
            with stats.get_lock():  # shared by every outsider: += alone would lose counts
                stats[2] += won
                stats[3] += 1
            if won:
                provider.release_lease(key, owner)
            n += 1
    except Exception as exc:
        errors.put(f"outsider {worker}: {type(exc).__name__}: {exc}")


def transfer_race(
    config: ProviderConfig,
    *,
    outsiders: int = 7,
    transfers: int = 300,
    ttl_ms: int = 10_000,
    key: str = "transfer-race",
    timeout_s: float = 300,
) -> tuple[RaceReport, int]:
    """One process passes the lease along a chain of owners with ``transfer_lease`` while
    ``outsiders`` processes hammer ``acquire_lease``. Returns the report and how many acquire
    attempts the outsiders made (to show they really competed)."""
    started, stop = _CTX.Event(), _CTX.Event()
    errors = _CTX.Queue()
    stats: Synchronized[int] | SynchronizedArray[int] = _CTX.Array("q", 4)
    assert isinstance(stats, SynchronizedArray)
    procs = [
        _CTX.Process(
            target=_insider,
            args=(config, key, transfers, ttl_ms, 5 * outsiders, started, stop, stats, errors),
        )
    ]
    procs += [
        _CTX.Process(target=_outsider, args=(config, w, key, ttl_ms, started, stop, stats, errors))
        for w in range(outsiders)
    ]
    _run_all(procs, timeout_s)
    report = RaceReport(
        transfers=stats[0], failed_transfers=stats[1], outsider_wins=stats[2], errors=_drain(errors)
    )
    return report, stats[3]


def _run_all(processes: list[Any], timeout_s: float) -> None:
    for proc in processes:
        proc.start()
    deadline = time.monotonic() + timeout_s
    for proc in processes:
        proc.join(max(deadline - time.monotonic(), 0.1))
    hung = [p for p in processes if p.is_alive()]
    for proc in hung:
        proc.kill()
        proc.join()
    if hung:
        raise TimeoutError(f"{len(hung)} race worker(s) did not finish in {timeout_s} s")


def _drain(queue: Any) -> list[str]:
    items: list[str] = []
    while True:
        try:
            items.append(queue.get(timeout=0.1))
        except Exception:
            return items
