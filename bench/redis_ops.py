"""One-at-a-time throughput of leaseguard's Redis operations against the usual alternatives.

Every measurement is sequential: one client, one call at a time, each waiting for its reply,
which is how a Lambda invocation uses a lease. In the same run, on the same server and the same
redis-py client settings:

* leaseguard ``acquire_lease`` (a free key), ``renew_lease``, ``release_lease``,
  ``transfer_lease`` and an acquire+release cycle;
* the naive, unsafe raw pair ``SET key v NX PX ttl`` + ``DEL key`` (what a lock without owner
  check costs), and each half alone;
* redis-py's ``Lock`` (``acquire(blocking=False)`` + ``release()``);
* python-redis-lock's ``redis_lock.Lock`` (``acquire(blocking=False)`` + ``release()``);
* two diagnostics: the raw pair, and our two scripts with precomputed arguments, each sent the
  way leaseguard sends its scripts (on a kept connection, ``providers/redis/direct.py``, rather
  than through redis-py's ``execute_command`` as the raw pair and both locks are).

Each measurement runs ``--rounds`` rounds of ``--ops`` calls, the implementations interleaved
round by round so that drift hits all of them alike; the table gives the median round. Many short
rounds (75 of 200 calls by default) keep the runs that a ratio compares close in time, which on
a machine shared with other work moves the ratios less than 15 rounds of 1,000 did. The lock
objects of both libraries are created once and reused (their cheapest use). A breakdown then
splits our cycle into server work, redis-py and leaseguard's own Python, and (on the server it
started) a table gives each plain lease script's server time per call.

    .venv/bin/python bench/redis_ops.py                   # starts its own redis-server
    .venv/bin/python bench/redis_ops.py --redis-url redis://127.0.0.1:6379/0

On a server of your own (``--redis-url``) it writes only keys whose names contain a fresh
``bench-*:`` prefix, and they expire within a minute. Numbers are never asserted anywhere: see
docs/benchmarks.md for recorded runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import redis

from leaseguard.providers.redis import ACQUIRE_LUA, RELEASE_LUA, RedisLeaseProvider
from leaseguard.providers.redis.direct import DirectCalls
from leaseguard.testing import RedisServer

TTL_MS = 30_000
RAW_PAIR = "raw SET NX PX + DEL"
KEPT_RAW_PAIR = "(diagnostic) raw SET NX PX + DEL, kept connection"
REDIS_PY_LOCK = "redis-py Lock"
CYCLE = "acquire+release cycle"
# The performance issue's targets for the cycle, as the median of per-round ratios.
TARGET_VS_RAW_PAIR = 0.95
TARGET_VS_REDIS_PY_LOCK = 1.00

# (run, cleanup): ``run`` makes ``ops`` timed calls; ``cleanup`` is untimed.
Prepared = tuple[Callable[[], None], Callable[[], None]]


@dataclass
class Measurement:
    operation: str
    implementation: str
    round_trips: int
    prepare: Callable[[int], Prepared]
    seconds: list[float] = field(default_factory=list)

    def ops_per_s(self, ops: int) -> float:
        return ops / statistics.median(self.seconds)

    def us_per_op(self, ops: int) -> float:
        return statistics.median(self.seconds) / ops * 1e6

    def speed_vs(self, other: Measurement) -> float:
        """Median over rounds of other's time / this time: each round's two runs are close
        in time, so load from elsewhere on the machine mostly cancels out."""
        return statistics.median(o / t for o, t in zip(other.seconds, self.seconds, strict=True))


class Bench:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        import redis_lock

        self.client = client
        self.prefix = prefix
        self.provider = RedisLeaseProvider(client, prefix=f"{prefix}lg:")
        self.kept = DirectCalls(client)  # how the provider sends its scripts, for diagnostics
        self._n = 0
        self.redis_py_lock = client.lock(f"{prefix}redis-py-lock", timeout=TTL_MS / 1000)
        self.python_redis_lock = redis_lock.Lock(
            client, f"{prefix}python-redis-lock", expire=TTL_MS // 1000
        )

    def fresh(self, what: str, n: int) -> list[str]:
        self._n += 1
        return [f"{what}-{self._n}-{i}" for i in range(n)]

    # -- leaseguard -----------------------------------------------------------------------------

    def lg_acquire(self, ops: int) -> Prepared:
        keys, acquire = self.fresh("acquire", ops), self.provider.acquire_lease

        def run() -> None:
            for key in keys:
                acquire(key, "bench", TTL_MS)

        return run, lambda: self._release_all(keys, "bench")

    def lg_renew(self, ops: int) -> Prepared:
        (key,), renew = self.fresh("renew", 1), self.provider.renew_lease
        self.provider.acquire_lease(key, "bench", TTL_MS)

        def run() -> None:
            for _ in range(ops):
                renew(key, "bench", TTL_MS)

        return run, lambda: self._release_all([key], "bench")

    def lg_release(self, ops: int) -> Prepared:
        keys, release = self.fresh("release", ops), self.provider.release_lease
        for key in keys:
            self.provider.acquire_lease(key, "bench", TTL_MS)

        def run() -> None:
            for key in keys:
                release(key, "bench")

        return run, lambda: None

    def lg_transfer(self, ops: int) -> Prepared:
        (key,), transfer = self.fresh("transfer", 1), self.provider.transfer_lease
        owners = [f"owner-{i}" for i in range(ops + 1)]
        self.provider.acquire_lease(key, owners[0], TTL_MS)

        def run() -> None:
            for i in range(ops):
                transfer(key, owners[i], owners[i + 1], TTL_MS)

        return run, lambda: self._release_all([key], owners[-1])

    def lg_cycle(self, ops: int) -> Prepared:
        (key,) = self.fresh("cycle", 1)
        acquire, release = self.provider.acquire_lease, self.provider.release_lease

        def run() -> None:
            for _ in range(ops):
                acquire(key, "bench", TTL_MS)
                release(key, "bench")

        return run, lambda: None

    def _release_all(self, keys: list[str], owner: str) -> None:
        for key in keys:
            self.provider.release_lease(key, owner)

    # -- baselines ------------------------------------------------------------------------------

    def raw_set(self, ops: int) -> Prepared:
        keys, set_ = self.fresh(f"{self.prefix}raw-set", ops), self.client.set

        def run() -> None:
            for key in keys:
                set_(key, "bench", nx=True, px=TTL_MS)

        return run, lambda: self._delete(keys)

    def raw_del(self, ops: int) -> Prepared:
        keys, delete = self.fresh(f"{self.prefix}raw-del", ops), self.client.delete
        for key in keys:
            self.client.set(key, "bench", nx=True, px=TTL_MS)

        def run() -> None:
            for key in keys:
                delete(key)

        return run, lambda: None

    def raw_pair(self, ops: int) -> Prepared:
        key, set_, delete = f"{self.prefix}raw-pair", self.client.set, self.client.delete

        def run() -> None:
            for _ in range(ops):
                set_(key, "bench", nx=True, px=TTL_MS)
                delete(key)

        return run, lambda: None

    def redis_py_lock_cycle(self, ops: int) -> Prepared:
        lock = self.redis_py_lock

        def run() -> None:
            for _ in range(ops):
                lock.acquire(blocking=False)
                lock.release()

        return run, lambda: None

    def python_redis_lock_cycle(self, ops: int) -> Prepared:
        lock = self.python_redis_lock

        def run() -> None:
            for _ in range(ops):
                lock.acquire(blocking=False)
                lock.release()

        return run, lambda: None

    def _delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 500):
            self.client.delete(*keys[i : i + 500])

    # -- the breakdown of our cycle -------------------------------------------------------------

    def bare_scripts_cycle(self, ops: int) -> Prepared:
        """Our two scripts by plain EVALSHA with precomputed arguments, sent as leaseguard
        sends them (on a kept connection): no validation, no key building, no reply parsing.
        What the cycle would cost with zero leaseguard Python."""
        (key,) = self.fresh("bare", 1)
        keys = self.provider.redis_keys(key)
        acquire = ("EVALSHA", ACQUIRE_LUA.sha, len(keys), *keys, key, "bench", TTL_MS)
        release = ("EVALSHA", RELEASE_LUA.sha, len(keys), *keys, key, "bench")
        send = self.kept

        def run() -> None:
            for _ in range(ops):
                send(*acquire)
                send(*release)

        return run, lambda: None

    def raw_pair_kept(self, ops: int) -> Prepared:
        """The raw pair sent the way leaseguard sends its scripts (a kept connection, not
        ``execute_command``): what the server-side difference alone costs."""
        key, send = f"{self.prefix}raw-pair-kept", self.kept
        set_args = ("SET", key, "bench", "NX", "PX", TTL_MS)

        def run() -> None:
            for _ in range(ops):
                send(*set_args)
                send("DEL", key)

        return run, lambda: None

    def measurements(self) -> list[Measurement]:
        m = Measurement
        return [
            m("acquire (free key)", "leaseguard", 1, self.lg_acquire),
            m("acquire (free key)", "raw SET NX PX", 1, self.raw_set),
            m("renew", "leaseguard", 1, self.lg_renew),
            m("release", "leaseguard", 1, self.lg_release),
            m("release", "raw DEL", 1, self.raw_del),
            m("transfer", "leaseguard", 1, self.lg_transfer),
            m(CYCLE, "leaseguard", 2, self.lg_cycle),
            m(CYCLE, RAW_PAIR, 2, self.raw_pair),
            m(CYCLE, REDIS_PY_LOCK, 2, self.redis_py_lock_cycle),
            m(CYCLE, "python-redis-lock", 3, self.python_redis_lock_cycle),
            m(CYCLE, KEPT_RAW_PAIR, 2, self.raw_pair_kept),
            m(
                CYCLE,
                "(diagnostic) our scripts by bare EVALSHA, kept connection",
                2,
                self.bare_scripts_cycle,
            ),
        ]


def run_rounds(measurements: list[Measurement], ops: int, rounds: int, warmup: int) -> None:
    for m in measurements:  # loads scripts, opens the connection, warms caches
        run, cleanup = m.prepare(warmup)
        run()
        cleanup()
    for r in range(rounds):
        k = r % len(measurements)
        for m in measurements[k:] + measurements[:k]:  # no implementation always runs first
            run, cleanup = m.prepare(ops)
            gc.collect()
            start = time.perf_counter()
            run()
            m.seconds.append(time.perf_counter() - start)
            cleanup()


def table(measurements: list[Measurement], ops: int) -> str:
    pair = next(m for m in measurements if m.implementation == RAW_PAIR)
    lines = [
        "| operation | implementation | round trips | ops/s (median) | µs/op | vs raw pair |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for m in measurements:
        ratio = f"{m.speed_vs(pair):.2f}x" if m.operation == CYCLE else ""
        lines.append(
            f"| {m.operation} | {m.implementation} | {m.round_trips} "
            f"| {m.ops_per_s(ops):,.0f} | {m.us_per_op(ops):.1f} | {ratio} |"
        )
    return "\n".join(lines)


# -- breakdown: where one cycle's time goes -------------------------------------------------------


def python_cost_us(fn: Callable[[], Any], loops: int = 20_000) -> float:
    """Median µs per call of a function that does no I/O."""
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - start) / loops * 1e6)
    return statistics.median(samples)


class _NoIO:
    """Stands in for a provider's Redis client: answers EVALSHA at once with a canned reply, so
    timing the public API through it leaves leaseguard's own Python."""

    def __init__(self, replies: dict[str, Any]) -> None:
        self.replies = replies

    def execute_command(self, command: str, sha: str, *keys_and_args: Any) -> Any:
        return self.replies[sha]


def leaseguard_python_us(client: redis.Redis) -> float:
    """Validation, key names, the EVALSHA call and reply parsing of one acquire and one
    release, minus the stand-in's own cost."""
    provider = RedisLeaseProvider(client, prefix="python-only:")
    stub = _NoIO({ACQUIRE_LUA.sha: [1, b"bench", b"1732880000123456"], RELEASE_LUA.sha: 1})
    provider.execute = stub.execute_command
    keys = provider.redis_keys("k")
    public = python_cost_us(
        lambda: (provider.acquire_lease("k", "bench", TTL_MS), provider.release_lease("k", "bench"))
    )
    floor = python_cost_us(
        lambda: (
            stub.execute_command(
                "EVALSHA", ACQUIRE_LUA.sha, len(keys), *keys, "k", "bench", TTL_MS
            ),
            stub.execute_command("EVALSHA", RELEASE_LUA.sha, len(keys), *keys, "k", "bench"),
        )
    )
    return public - floor


def server_us(client: redis.Redis, commands: tuple[str, ...], call: Callable[[], Any]) -> float:
    """Server-side µs per ``call`` spent in ``commands`` (INFO commandstats after CONFIG
    RESETSTAT; a script's time includes the commands it runs)."""
    n = 2000
    client.config_resetstat()
    for _ in range(n):
        call()
    stats = client.info("commandstats")
    client.config_resetstat()
    return sum(float(stats[f"cmdstat_{c}"]["usec"]) for c in commands) / n


def breakdown(bench: Bench, measurements: list[Measurement], ops: int, own_server: bool) -> str:
    provider, client = bench.provider, bench.client
    key, owner = f"{bench.prefix}breakdown", "bench"
    keys = provider.redis_keys(key)
    ours_args = [
        ("EVALSHA", ACQUIRE_LUA.sha, len(keys), *keys, key, owner, TTL_MS),
        ("EVALSHA", RELEASE_LUA.sha, len(keys), *keys, key, owner),
    ]
    raw_args = [("SET", key, owner, "NX", "PX", TTL_MS), ("DEL", key)]
    packer = client.connection_pool.make_connection()  # never connected: it only encodes

    def pack_us(commands: list[tuple[Any, ...]]) -> float:
        return sum(python_cost_us(lambda c=c: packer.pack_command(*c)) for c in commands)

    by_impl = {(m.operation, m.implementation): m for m in measurements}
    ours, raw = by_impl[(CYCLE, "leaseguard")], by_impl[(CYCLE, RAW_PAIR)]
    rows: list[tuple[str, float, float]] = [
        ("wall time of one cycle (median round, table above)", ours.us_per_op(ops),
         raw.us_per_op(ops)),
        ("leaseguard Python: checks, key names, EVALSHA call, reply parsing",
         leaseguard_python_us(client), 0.0),
        ("redis-py request encoding (pack_command)", pack_us(ours_args), pack_us(raw_args)),
    ]  # fmt: skip
    if own_server:  # CONFIG RESETSTAT: never on a server someone else uses
        rows.append(
            (
                "server time inside the commands (INFO commandstats)",
                server_us(
                    client,
                    ("evalsha",),
                    lambda: [client.execute_command(*c) for c in ours_args],
                ),
                server_us(
                    client, ("set", "del"), lambda: [client.execute_command(*c) for c in raw_args]
                ),
            )
        )
    rest = (
        rows[0][1] - sum(r[1] for r in rows[1:]),
        rows[0][2] - sum(r[2] for r in rows[1:]),
    )
    rows.append(("the rest: sockets, reply parsing, scheduling", *rest))
    out = [
        "| one acquire+release cycle, µs | leaseguard | raw SET NX PX + DEL |",
        "|---|---:|---:|",
    ]
    out += [f"| {label} | {a:.1f} | {b:.1f} |" for label, a, b in rows]
    return "\n".join(out)


def server_per_call(bench: Bench, n: int = 1000, repeats: int = 5) -> str:
    """Server µs per call of each plain lease script (``usec_per_call`` of EVALSHA in INFO
    commandstats, the commands the script runs included) and of the raw commands, each on keys
    in the state the cycle leaves them in (acquired and released once before); median of
    ``repeats`` batches of ``n`` calls. Runs CONFIG RESETSTAT: own server only."""
    provider, client, raw = bench.provider, bench.client, f"{bench.prefix}raw-"
    steps: list[tuple[str, str, Callable[[str], Any]]] = [
        ("acquire (free key)", "evalsha", lambda k: provider.acquire_lease(k, "a", TTL_MS)),
        ("renew", "evalsha", lambda k: provider.renew_lease(k, "a", TTL_MS)),
        ("transfer", "evalsha", lambda k: provider.transfer_lease(k, "a", "b", TTL_MS)),
        ("release", "evalsha", lambda k: provider.release_lease(k, "b")),
        ("raw SET NX PX", "set", lambda k: client.set(raw + k, "a", nx=True, px=TTL_MS)),
        ("raw DEL", "del", lambda k: client.delete(raw + k)),
    ]  # fmt: skip
    samples: dict[str, list[float]] = {label: [] for label, _, _ in steps}
    for _ in range(repeats):
        keys = bench.fresh("server", n)
        for key in keys:
            provider.acquire_lease(key, "a", TTL_MS)
            provider.release_lease(key, "a")
        for label, command, call in steps:
            client.config_resetstat()
            for key in keys:
                call(key)
            row = client.info("commandstats")[f"cmdstat_{command}"]
            samples[label].append(float(row["usec"]) / int(row["calls"]))
    client.config_resetstat()
    out = ["| server time of one call (INFO commandstats usec_per_call) | µs |", "|---|---:|"]
    out += [f"| {label} | {statistics.median(v):.2f} |" for label, v in samples.items()]
    return "\n".join(out)


# -- the machine ----------------------------------------------------------------------------------


def machine(client: redis.Redis) -> str:
    server = client.info("server")
    uname = " ".join(platform.uname())
    with suppress(OSError):
        done = subprocess.run(["uname", "-a"], capture_output=True, text=True, check=True)
        uname = done.stdout.strip()
    return "\n".join(
        [
            f"- `uname -a`: {uname}",
            f"- `nproc`: {os.cpu_count()}",
            f"- Python {platform.python_version()} ({platform.python_implementation()}), "
            f"redis-py {redis.__version__}",
            f"- redis-server {server['redis_version']} (`{server.get('executable', '?')}`), "
            "loopback TCP, persistence off",
            "- load average (1, 5, 15 min) at the end: "
            + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        ]
    )


@contextmanager
def redis_client(url: str | None) -> Iterator[tuple[redis.Redis, bool]]:
    if url:
        client = redis.Redis.from_url(url)
        try:
            yield client, False
        finally:
            client.close()
        return
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            yield client, True
        finally:
            client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="use this server instead of starting one")
    parser.add_argument("--ops", type=int, default=200, help="calls per round (default 200)")
    parser.add_argument("--rounds", type=int, default=75, help="rounds (default 75)")
    parser.add_argument("--warmup", type=int, default=500, help="untimed calls first")
    args = parser.parse_args(argv)

    with redis_client(args.redis_url) as (client, own_server):
        prefix = f"bench-{uuid.uuid4().hex[:8]}:"
        bench = Bench(client, prefix)
        measurements = bench.measurements()
        run_rounds(measurements, args.ops, args.rounds, args.warmup)

        pair = next(m for m in measurements if m.implementation == RAW_PAIR)
        ours = next(
            m for m in measurements if (m.operation, m.implementation) == (CYCLE, "leaseguard")
        )
        locks = [
            m for m in measurements if m.implementation in (REDIS_PY_LOCK, "python-redis-lock")
        ]
        ratio = ours.speed_vs(pair)
        kept = next(m for m in measurements if m.implementation == KEPT_RAW_PAIR)
        versus = {m.implementation: ours.speed_vs(m) for m in locks}
        vs_lock = versus[REDIS_PY_LOCK]

        print(f"{args.rounds} rounds x {args.ops} calls each, median round\n")
        print(table(measurements, args.ops))
        print()
        print(
            f"Our acquire+release cycle runs at **{ratio:.2f}x** the raw SET NX PX + DEL pair "
            f"(target >= {TARGET_VS_RAW_PAIR:.2f}x: "
            f"{'met' if ratio >= TARGET_VS_RAW_PAIR else 'missed'}), at **{vs_lock:.2f}x** "
            f"redis-py Lock (target >= {TARGET_VS_REDIS_PY_LOCK:.2f}x: "
            f"{'met' if vs_lock >= TARGET_VS_REDIS_PY_LOCK else 'missed'}) and at "
            f"{versus['python-redis-lock']:.2f}x python-redis-lock. Sent the same way as ours"
            f" (a kept connection), the raw pair would run "
            f"{kept.speed_vs(ours):.2f}x as fast as our cycle: what the scripts' server work"
            " costs."
        )
        print()
        print(breakdown(bench, measurements, args.ops, own_server))
        print()
        if own_server:
            print(server_per_call(bench))
            print()
        print(machine(client))
        print(f"- command: `{' '.join([os.path.relpath(sys.executable), *sys.argv])}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
