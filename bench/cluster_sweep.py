"""What one sweep of a Redis Cluster's per-slot indexes costs: the orphan scan behind
``adopt_orphans`` and the dead-letter listing behind ``dead_letter_keys``.

Keys with pending work (and keys with dead letters) are indexed in one sorted set per Cluster
slot, 16,384 in all. The provider reads a primary's slot indexes in one script run
(``scan_slot_indexes.lua``); redis-py's Cluster pipeline, one command per slot, is its fallback
(Redis before 7, a slot that moved). This script starts a 3-master Cluster, leaves ``--keys``
keys orphaned (their owner's lease ran out with a signal queued) and with a dead letter each,
then times ``--rounds`` scans of each kind both ways, interleaved, and prints the median wall
time and client CPU time of one scan. Both ways must find the same keys, or it exits 1.

    .venv/bin/python bench/cluster_sweep.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from leaseguard import Signal
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import RedisClusterServers

TTL_MS = 60_000


def orphan(provider: RedisLeaseProvider, keys: list[str]) -> None:
    for key in keys:
        first = provider.acquire_or_enqueue(key, Signal(f"{key}/a", 1), TTL_MS)
        provider.acquire_or_enqueue(key, Signal(f"{key}/b", 2), TTL_MS)
        provider.acquire_or_enqueue(key, Signal(f"{key}/c", 3), TTL_MS)
        head = provider.transfer_to_next(
            key, f"{key}/a", TTL_MS, token=first.token, error="x", max_attempts=1
        )
        assert head is not None
        assert provider.renew_lease(key, head.id, 1, token=head.token)  # its owner dies
    time.sleep(0.01)


def timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    cpu, wall = time.process_time(), time.perf_counter()
    found = call()
    return time.perf_counter() - wall, time.process_time() - cpu, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100, help="orphaned keys (default 100)")
    parser.add_argument("--rounds", type=int, default=9, help="scans of each kind (default 9)")
    args = parser.parse_args(argv)
    with RedisClusterServers(3) as cluster:
        scripted = RedisLeaseProvider.from_url(cluster.url, cluster=True, prefix="sweep:")
        piped = RedisLeaseProvider.from_url(cluster.url, cluster=True, prefix="sweep:")
        assert piped._slot_indexes is not None
        piped._slot_indexes.scripted = False  # the fallback, as before Redis 7
        keys = [f"key {n}" for n in range(args.keys)]
        orphan(scripted, keys)
        ways: dict[str, Callable[[], Any]] = {
            "orphan scan, one script run per primary": lambda: scripted._orphan_candidates(1000),
            "orphan scan, redis-py pipeline": lambda: piped._orphan_candidates(1000),
            "dead-letter listing, one script run per primary": lambda: scripted.dead_letter_keys(
                1000
            ),
            "dead-letter listing, redis-py pipeline": lambda: piped.dead_letter_keys(1000),
        }
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        found: dict[str, Any] = {}
        for call in ways.values():
            call()  # warm-up: script load, connections, the slot grouping
        for _ in range(args.rounds):
            for name, call in ways.items():
                wall, cpu, found[name] = timed(call)
                samples[name].append((wall, cpu))
    names = list(ways)
    if not sorted(found[names[0]]) == sorted(found[names[1]]) == sorted(keys):
        print("the two orphan scans disagree", file=sys.stderr)
        return 1
    if found[names[2]] != found[names[3]] or found[names[2]] != sorted(keys):
        print("the two dead-letter listings disagree", file=sys.stderr)
        return 1
    print(f"3-master Redis Cluster on loopback, {args.keys} orphaned keys, median of "
          f"{args.rounds} interleaved scans each\n")  # fmt: skip
    print("| one scan of the 16,384 slot indexes | wall ms | client CPU ms |")
    print("|---|---:|---:|")
    for name in names:
        wall = statistics.median(s[0] for s in samples[name]) * 1000
        cpu = statistics.median(s[1] for s in samples[name]) * 1000
        print(f"| {name} | {wall:.1f} | {cpu:.1f} |")
    print(f"\n- Python {platform.python_version()}, {platform.node()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")  # fmt: skip
    print(f"- command: `{' '.join([os.path.relpath(sys.executable), *sys.argv])}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
