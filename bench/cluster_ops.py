"""One-at-a-time lease operations on a Redis Cluster: sent the way the provider sends them to
a plain ``RedisCluster`` (straight to the key's primary on a kept connection,
``providers/redis/direct.py``'s ``ClusterCalls``), against the same provider sending every
script through redis-py's ``RedisCluster.execute_command`` (what it did before), and
redis-py's own ``Lock`` on the same client (``acquire(blocking=False)`` + ``release()``).

Starts a 3-master Cluster on loopback, then runs ``--rounds`` rounds of ``--cycles``
acquire+release cycles per implementation, interleaved with the order rotated every round,
on keys spread over the three primaries. Prints the median round's cycles/s, wall and client
CPU µs per cycle, and the median of per-round ratios to the ``execute_command`` way. Every
cycle must acquire and release, or it exits 1.

    .venv/bin/python bench/cluster_ops.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

from redis.cluster import RedisCluster

from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.providers.redis.direct import ClusterCalls
from leaseguard.testing import RedisClusterServers

TTL_MS = 10_000
KEYS = [f"order-{n}" for n in range(30)]


def leaseguard_cycles(provider: RedisLeaseProvider) -> Callable[[int], bool]:
    def run(n: int) -> bool:
        ok = True
        for i in range(n):
            key = KEYS[i % len(KEYS)]
            ok &= provider.acquire_lease(key, "bench", TTL_MS).acquired
            provider.release_lease(key, "bench")
        return ok

    return run


def lock_cycles(client: RedisCluster) -> Callable[[int], bool]:
    locks = [client.lock(f"lock:{{{key}}}", timeout=TTL_MS / 1000) for key in KEYS]

    def run(n: int) -> bool:
        ok = True
        for i in range(n):
            lock = locks[i % len(locks)]
            ok &= bool(lock.acquire(blocking=False))
            lock.release()
        return ok

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25, help="rounds (default 25)")
    parser.add_argument("--cycles", type=int, default=200, help="cycles a round (default 200)")
    args = parser.parse_args(argv)
    with RedisClusterServers(3) as cluster:
        client = RedisCluster.from_url(cluster.url)
        direct = RedisLeaseProvider(client, prefix="ops:")
        assert isinstance(direct.execute, ClusterCalls)
        usual = RedisLeaseProvider(client, prefix="ops:")
        usual.execute = client.execute_command  # the way before ClusterCalls
        ways: dict[str, Callable[[int], bool]] = {
            "leaseguard, ClusterCalls (kept connections)": leaseguard_cycles(direct),
            "leaseguard, RedisCluster.execute_command": leaseguard_cycles(usual),
            "redis-py Lock on the same RedisCluster": lock_cycles(client),
        }
        for run in ways.values():
            if not run(len(KEYS)):  # warm-up: scripts loaded, connections made
                print("a warm-up cycle did not acquire", file=sys.stderr)
                return 1
        names = list(ways)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                cpu, wall = time.process_time(), time.perf_counter()
                if not ways[name](args.cycles):
                    print(f"{name}: a cycle did not acquire", file=sys.stderr)
                    return 1
                samples[name].append((time.perf_counter() - wall, time.process_time() - cpu))
        client.close()
    base = names[1]
    print(f"3-master Redis Cluster on loopback, {args.rounds} rounds x {args.cycles} "
          "acquire+release cycles, interleaved, median round\n")  # fmt: skip
    print("| implementation | cycles/s | wall µs/cycle | client CPU µs/cycle "
          "| vs execute_command |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for name in names:
        wall = statistics.median(s[0] for s in samples[name]) / args.cycles * 1e6
        cpu = statistics.median(s[1] for s in samples[name]) / args.cycles * 1e6
        pairs = zip(samples[name], samples[base], strict=True)
        ratio = statistics.median(b[0] / s[0] for s, b in pairs)
        print(f"| {name} | {1e6 / wall:,.0f} | {wall:.1f} | {cpu:.1f} | {ratio:.2f}x |")
    print(f"\n- Python {platform.python_version()}, {platform.node()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"- command: `{' '.join([os.path.relpath(sys.executable), *sys.argv])}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
