"""Events per second through the full guarded path on one busy Redis key, against the ceiling.

Each of ``--processes`` worker processes (8) calls a handler decorated with
``@lease_owned(..., handoff="inline")`` whose only work is to record the event id it ran, with
its share of ``--events`` events ``{"key": k, "id": i}``. Event ``i`` goes to key ``i % K``
(round robin over K keys, ``--keys 1,8,64``); the events are dealt to the processes in a seeded
shuffle, so which process sends an event says nothing about its key. An invocation that finds its
key held forwards the event (one ``acquire_or_enqueue``) and returns at once; the owner runs the
forwarded events inline, one ``transfer_to_next`` each, until the queue is empty. Everything
runs through the library as a deployed function would use it: a ``LambdaContext`` per call (its
request id is the signal id), the default logger (worker stdout goes to ``/dev/null``), the
default TTL and renewal period. The only non-default setting is ``max_queue``: a bound the
forwarders could hit (they outrun the owner) would make the run measure the retries.

The same curve is measured with the decorator's ``drain_batch=--batch`` (100; 0 skips it): an
owner that was handed the key takes up to that many queued events in one ``take_signals`` and
runs them under its grant, one ``transfer_to_next`` per batch (docs/protocol.md, row G8).

In the same run, on the same server and with the same client settings, the ceiling: one client
calling ``EVALSHA`` of a trivial script (``return 1``) one at a time for ``--seconds``, sent the
way the provider sends its scripts (a kept connection, ``providers/redis/direct.py``, about
twice as fast as redis-py's ``execute_command`` on these machines: the ceiling is the cheapest
one-at-a-time call redis-py allows); next to it the same loop through ``execute_command``, the
usual call, whose rate leaseguard's own calls no longer pay; and, for context, the server's
parallel ceiling: the same loop in every worker process at once. Two
diagnostic 1-key runs (``--no-diagnostics`` skips them) show what two changes to the library
would buy, without changing it: the guard without its renewer (the flow's
``LeaseRenewer`` replaced by a no-op in the worker processes), and a handler that drains the
queue itself with ``current_lease().take_signals(--take)``, many events per round trip.

Every configuration runs once per round, ``--rounds`` rounds, the order rotated every round so
that drift hits all of them alike; the table gives the median round, and the ratio to the
ceiling is the median of per-round ratios. Events/s is events run divided by the time from the
workers' start barrier to the last handler run. After each guarded run every key must be idle
(no owner, nothing queued or in flight, no dead letter) and every event id must have run exactly
once; the script prints any violation and exits 1, since a benchmark that loses events measures
nothing. ``INFO commandstats`` deltas give the Redis calls per event.

A profile follows (``--no-profile`` skips it): round trips per event by script, the server time
and the commands of each script, the owner's drain measured in this process (as it is, without
its renewer thread, by ``take_signals`` batches, and the bare ``transfer_to_next`` loop), the
forwarder's cost, the price of the pieces, and cProfile's top entries for the drain and for the
forward. ``--plot PATH`` writes a PNG of the curve (matplotlib), ``--json PATH`` every round.

    .venv/bin/python bench/hot_key.py                        # starts its own redis-server
    .venv/bin/python bench/hot_key.py --plot docs/images/hot_key.png
    .venv/bin/python bench/hot_key.py --redis-url redis://127.0.0.1:6379/0

On a server of your own (``--redis-url``) it writes only keys under a fresh ``bench-*:`` prefix
and deletes them at the end; its ``INFO`` deltas then include the other clients' commands.
Numbers are never asserted anywhere: see docs/benchmarks.md for recorded runs.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import logging
import multiprocessing
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import redis

from leaseguard import HandoffConfig, current_lease, lease_owned
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.providers.redis.scripts import SCRIPTS
from leaseguard.testing import LambdaContext, RedisServer
from leaseguard.types import Signal

TRIVIAL_LUA = "return 1"
MAX_QUEUE = 1_000_000  # the provider's ceiling: a forward is never refused
TTL_MS = 15_000  # the decorator's default
CEILING = "EVALSHA `return 1`, 1 client"
USUAL_CEILING = "EVALSHA `return 1`, 1 client, redis-py execute_command"


def script_names(trivial_sha: str) -> dict[str, str]:
    names = {s.sha: s.name for s in SCRIPTS}
    names[trivial_sha] = "trivial"
    return names


# -- the worker processes -------------------------------------------------------------------------


def worker(index: int, url: str, prefix: str, conn: Connection, barrier: Any) -> None:
    """One process: builds its provider and guarded handler once, then runs what it is sent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the default logger writes a line per forward to stdout
    provider = RedisLeaseProvider.from_url(url, prefix=prefix, max_queue=MAX_QUEUE)
    ran: list[int] = []
    last_run = [0.0]
    batch = [0]

    @lease_owned(lambda event: event["key"], provider=provider, handoff="inline")
    def handler(event: dict[str, Any], context: Any) -> None:
        ran.append(event["id"])
        last_run[0] = time.perf_counter()

    @lease_owned(lambda event: event["key"], provider=provider, handoff="inline")
    def taking_handler(event: dict[str, Any], context: Any) -> None:
        """Diagnostic: also runs what is queued behind it, ``take_signals(batch)`` at a time."""
        ran.append(event["id"])
        lease = current_lease()
        while taken := lease.take_signals(batch[0]):
            ran.extend(signal.payload["id"] for signal in taken)
        last_run[0] = time.perf_counter()

    drained: dict[int, Callable[..., Any]] = {}

    def draining_handler(size: int) -> Callable[..., Any]:
        """The same handler with ``drain_batch=size`` (the owner runs batches of the queue
        under its grant, one take_signals and one hand-off per batch)."""
        if size not in drained:

            @lease_owned(
                lambda event: event["key"],
                provider=provider,
                handoff=HandoffConfig("inline", drain_batch=size),
            )
            def batch_handler(event: dict[str, Any], context: Any) -> None:
                ran.append(event["id"])
                last_run[0] = time.perf_counter()

            drained[size] = batch_handler
        return drained[size]

    while True:
        command = conn.recv()
        if command[0] == "stop":
            break
        if command[0] == "guarded":
            _, tag, events, take, threadless, count, drain = command
            run = taking_handler if take else draining_handler(drain) if drain else handler
            batch[0] = take
            ran.clear()
            last_run[0] = 0.0
            counts: Counter[str] = Counter()
            restore = _count_calls(provider, counts) if count else None
            errors: list[str] = []
            contexts = [LambdaContext(aws_request_id=f"{tag}-{i}") for i, _ in events]
            payloads = [{"key": key, "id": i} for i, key in events]
            gc.collect()
            with no_renewer_thread() if threadless else nullcontext():
                barrier.wait(60)
                cpu, start = time.process_time(), time.perf_counter()
                for event, context in zip(payloads, contexts, strict=True):
                    try:
                        run(event, context)
                    except Exception as exc:  # reported, and the event shows up as lost
                        errors.append(f"{type(exc).__name__}: {exc}")
                end, cpu = time.perf_counter(), time.process_time() - cpu
            if restore is not None:
                restore()
            conn.send(
                {
                    "ran": list(ran),
                    "start": start,
                    "last": last_run[0],
                    "end": end,
                    "cpu": cpu,
                    "errors": errors[:5],
                    "n_errors": len(errors),
                    "counts": dict(counts),
                }
            )
        elif command[0] == "evalsha":
            _, sha, seconds = command
            execute: Any = provider.execute  # as the provider sends its own scripts
            n = 0
            gc.collect()
            barrier.wait(60)
            start = time.perf_counter()
            deadline = start + seconds
            while time.perf_counter() < deadline:
                execute("EVALSHA", sha, 0)
                n += 1
            conn.send({"n": n, "start": start, "end": time.perf_counter()})
    conn.close()


def _count_calls(provider: RedisLeaseProvider, counts: Counter[str]) -> Callable[[], None]:
    """Count this process's Redis calls by script, and forwards by outcome (untimed runs only)."""
    execute = provider.execute
    enqueue = provider.acquire_or_enqueue

    def counting_execute(*args: Any, **kwargs: Any) -> Any:
        counts[f"call {args[1] if args[0] == 'EVALSHA' else args[0]}"] += 1
        return execute(*args, **kwargs)

    def counting_enqueue(*args: Any, **kwargs: Any) -> Any:
        result = enqueue(*args, **kwargs)
        counts["acquired" if result.acquired else "forwarded"] += 1
        return result

    provider.execute = counting_execute
    provider.acquire_or_enqueue = counting_enqueue  # type: ignore[method-assign]

    def restore() -> None:
        provider.execute = execute
        del provider.acquire_or_enqueue

    return restore


class Workers:
    def __init__(self, processes: int, url: str, prefix: str, start_method: str) -> None:
        ctx: Any = multiprocessing.get_context(start_method)
        self.barrier = ctx.Barrier(processes)
        self.conns: list[Connection] = []
        self.procs = []
        for i in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=worker, args=(i, url, prefix, child, self.barrier), daemon=True
            )
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def ask(self, commands: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        for conn, command in zip(self.conns, commands, strict=True):
            conn.send(command)
        return [conn.recv() for conn in self.conns]

    def close(self) -> None:
        for conn in self.conns:
            with suppress(OSError):
                conn.send(("stop",))
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


# -- the measurements -----------------------------------------------------------------------------


@dataclass
class Config:
    name: str
    # "guarded", "ceiling" (one client, a kept connection), "redis-py" (one client,
    # execute_command) or "parallel" (every worker process)
    kind: str
    keys: int = 0
    take: int = 0  # guarded: the handler also drains with take_signals(take) (diagnostic)
    drain: int = 0  # guarded: the decorator's drain_batch
    threadless: bool = False  # guarded: no renewer at all (diagnostic)
    seconds: list[float] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)
    stats: list[dict[str, float]] = field(default_factory=list)  # guarded: per-event figures

    def rates(self) -> list[float]:
        return [n / s for n, s in zip(self.ops, self.seconds, strict=True)]

    def rate(self) -> float:
        return statistics.median(self.rates())

    def ratio_to(self, other: Config) -> float:
        """Median over rounds of this rate / other's: runs of one round see the same load."""
        return statistics.median(a / b for a, b in zip(self.rates(), other.rates(), strict=True))

    def stat(self, name: str) -> float:
        return statistics.median(s[name] for s in self.stats)


class Bench:
    def __init__(
        self, url: str, prefix: str, workers: Workers, events: int, seconds: float
    ) -> None:
        self.url = url
        self.workers = workers
        self.events = events
        self.seconds = seconds
        self.prefix = prefix
        self.provider = RedisLeaseProvider.from_url(url, prefix=self.prefix, max_queue=MAX_QUEUE)
        self.client: Any = self.provider.client
        self.trivial_sha = str(self.client.script_load(TRIVIAL_LUA))
        self.violations: list[str] = []
        self._n = 0

    # -- one run of each kind -----------------------------------------------------------------

    def guarded(
        self,
        keys: int,
        events: int,
        *,
        take: int = 0,
        threadless: bool = False,
        count: bool = False,
        drain: int = 0,
    ) -> dict[str, Any]:
        """One guarded run over ``keys`` fresh keys; checks exactly-once and idle keys."""
        self._n += 1
        tag = f"r{self._n}"
        names = [f"{tag}-k{j}" for j in range(keys)]
        ids = list(range(events))
        random.Random(self._n).shuffle(ids)
        p = len(self.workers.conns)
        shares = [[(i, names[i % keys]) for i in ids[w::p]] for w in range(p)]
        before = self._info()
        replies = self.workers.ask(
            [("guarded", tag, share, take, threadless, count, drain) for share in shares]
        )
        after = self._info()
        self._check(tag, keys, events, names, replies)
        start = min(r["start"] for r in replies)
        last = max(r["last"] for r in replies)
        counts: Counter[str] = Counter()
        for r in replies:
            counts.update(r["counts"])
        calls = {
            name[len("cmdstat_") :]: after[name]["calls"] - before.get(name, {}).get("calls", 0)
            for name in after
            if name.startswith("cmdstat_")
        }
        calls.pop("info", None)
        return {
            "seconds": last - start,
            "done_pct": statistics.median((r["end"] - start) / (last - start) for r in replies)
            * 100,
            "ran": sum(len(r["ran"]) for r in replies),
            "evalsha": calls.pop("evalsha", 0) / events,
            "inside": sum(calls.values()) / events,
            "worker_cpu_us": sum(r["cpu"] for r in replies) / events * 1e6,
            "redis_cpu_us": (after["cpu"] - before["cpu"]) / events * 1e6,
            "counts": counts,
        }

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = dict(self.client.info("commandstats"))
        cpu = self.client.info("cpu")
        info["cpu"] = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        return info

    def _check(
        self, tag: str, keys: int, events: int, names: list[str], replies: list[dict[str, Any]]
    ) -> None:
        ran = Counter(i for r in replies for i in r["ran"])
        missing = [i for i in range(events) if i not in ran]
        twice = sorted(i for i, n in ran.items() if n > 1)
        problems = []
        if missing:
            problems.append(f"{len(missing)} events never ran (e.g. {missing[:5]})")
        if twice:
            problems.append(f"{len(twice)} events ran more than once (e.g. {twice[:5]})")
        for r in replies:
            if r["n_errors"]:
                problems.append(f"{r['n_errors']} handler calls raised, e.g. {r['errors'][0]}")
        busy = self._busy_keys(names)
        if busy:
            problems.append(f"{len(busy)} keys not idle after the run: {busy[:3]}")
        for problem in problems:
            message = f"run {tag} ({keys} keys, {events} events): {problem}"
            print(f"VIOLATION: {message}", file=sys.stderr)
            self.violations.append(message)

    def _busy_keys(self, names: list[str], wait_s: float = 5.0) -> list[str]:
        """Keys that still have an owner, queued or in-flight signals, or dead letters (waits a
        little first: the last owner's hand-off may still be on its way)."""
        deadline = time.monotonic() + wait_s
        while True:
            busy = []
            for name in names:
                state = self.provider.inspect_key(name)
                if state.owner or state.queued or state.in_flight or state.dead_letters:
                    busy.append(
                        f"{name}: owner={state.owner} queued={len(state.queued)} "
                        f"in_flight={len(state.in_flight)} dead={len(state.dead_letters)}"
                    )
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(0.1)

    def ceiling(self, seconds: float, usual: bool = False) -> tuple[int, float]:
        """One client, one EVALSHA of the trivial script at a time, for ``seconds``, sent as the
        provider sends its scripts (a kept connection: the cheapest way redis-py offers), or
        with ``usual`` through redis-py's ``execute_command``."""
        sha = self.trivial_sha
        execute = self.client.execute_command if usual else self.provider.execute
        n = 0
        gc.collect()
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            execute("EVALSHA", sha, 0)
            n += 1
        return n, time.perf_counter() - start

    def parallel(self, seconds: float) -> tuple[int, float]:
        replies = self.workers.ask(
            [("evalsha", self.trivial_sha, seconds)] * len(self.workers.conns)
        )
        return sum(r["n"] for r in replies), max(r["end"] for r in replies) - min(
            r["start"] for r in replies
        )

    # -- rounds -------------------------------------------------------------------------------

    def measure(self, config: Config) -> None:
        if config.kind == "guarded":
            run = self.guarded(
                config.keys,
                self.events,
                take=config.take,
                threadless=config.threadless,
                drain=config.drain,
            )
            config.seconds.append(run["seconds"])
            config.ops.append(run["ran"])
            config.stats.append(
                {
                    k: run[k]
                    for k in ("evalsha", "inside", "worker_cpu_us", "redis_cpu_us", "done_pct")
                }
            )
            return
        if config.kind == "parallel":
            n, seconds = self.parallel(self.seconds)
        else:
            n, seconds = self.ceiling(self.seconds, usual=config.kind == "redis-py")
        config.ops.append(n)
        config.seconds.append(seconds)

    def cleanup(self) -> None:
        """Deletes every key under this run's prefix (on a server of your own)."""
        batch = []
        for name in self.client.scan_iter(match=f"{self.prefix}*", count=1000):
            batch.append(name)
            if len(batch) >= 500:
                self.client.delete(*batch)
                batch.clear()
        if batch:
            self.client.delete(*batch)


def run_rounds(bench: Bench, configs: list[Config], rounds: int) -> None:
    bench.guarded(1, 200)  # warm-up: connections, SCRIPT LOAD, the guard's first call
    bench.guarded(8, 200)
    bench.ceiling(0.2)
    bench.parallel(0.2)
    for r in range(rounds):
        k = r % len(configs)
        for config in configs[k:] + configs[:k]:
            bench.measure(config)


def table(configs: list[Config], processes: int) -> str:
    ceiling = next(c for c in configs if c.kind == "ceiling")
    lines = [
        "| configuration | events or ops/s (median) | µs per event or op "
        "| vs one-client EVALSHA ceiling | EVALSHA per event | commands inside scripts per event "
        "| worker CPU µs/event | redis CPU µs/event | median worker done at (% of wall) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        ratio = statistics.median(a / b for a, b in zip(c.rates(), ceiling.rates(), strict=True))
        extra = "|  |  |  |  |  |"
        if c.kind == "guarded":
            extra = (
                f"| {c.stat('evalsha'):.2f} | {c.stat('inside'):.1f} "
                f"| {c.stat('worker_cpu_us'):.0f} | {c.stat('redis_cpu_us'):.0f} "
                f"| {c.stat('done_pct'):.0f}% |"
            )
        lines.append(f"| {c.name} | {c.rate():,.0f} | {1e6 / c.rate():.1f} | {ratio:.2f}x {extra}")
    return "\n".join(lines)


# -- the profile ----------------------------------------------------------------------------------


def round_trips(bench: Bench, keys_list: list[int], events: int) -> str:
    """One untimed guarded run per key count, each process counting its calls by script."""
    names = script_names(bench.trivial_sha)
    lines = [
        "| keys | acquire_or_enqueue / event | of which forwarded | transfer_to_next / event "
        "| other calls / event | owner runs (acquisitions) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for keys in keys_list:
        run = bench.guarded(keys, events, count=True)
        counts = run["counts"]
        by_script = Counter[str]()
        for what, n in counts.items():
            if what.startswith("call "):
                by_script[names.get(what[5:], what[5:])] += n
        aoe = by_script.pop("acquire_or_enqueue", 0)
        ttn = by_script.pop("transfer_to_next", 0)
        other = ", ".join(f"{k} {v / events:.3f}" for k, v in sorted(by_script.items())) or "0"
        lines.append(
            f"| {keys} | {aoe / events:.3f} | {counts['forwarded'] / events:.3f} "
            f"| {ttn / events:.3f} | {other} | {counts['acquired']} |"
        )
    return "\n".join(lines)


def _command_calls(client: redis.Redis) -> Counter[str]:
    """Calls of every command so far (``INFO commandstats``), commands run inside scripts
    included, INFO itself left out."""
    stats = client.info("commandstats")
    calls = Counter({k[len("cmdstat_") :]: int(v["calls"]) for k, v in stats.items()})
    calls["evalsha usec"] = int(stats.get("cmdstat_evalsha", {"usec": 0})["usec"])
    del calls["info"]
    return calls


def prelude_only() -> str:
    """The text every leaseguard script starts with (constants and shared prelude), followed by
    ``return 1``: what a script costs before it does anything."""
    from importlib import resources

    from leaseguard.protocol.model import DEDUPE_WINDOW_MS, DONE_LIMIT, TOKEN_MEMORY_MS

    prelude = (resources.files("leaseguard.providers") / "lua" / "_prelude.lua").read_text("utf-8")
    constants = (
        "local DEDUPE_WINDOW_MS, DONE_LIMIT, TOKEN_MEMORY_MS = "
        f"{DEDUPE_WINDOW_MS}, {DONE_LIMIT}, {TOKEN_MEMORY_MS}\n"
    )
    return constants + prelude + "\nreturn 1\n"


def script_costs(bench: Bench, n: int = 1000) -> str:
    """One client, one call at a time: wall µs per call, the server's µs inside the script
    (``INFO commandstats`` deltas of ``evalsha``) and the commands it runs, by name, for the
    steps of a hot key."""
    provider, client = bench.provider, bench.client
    tag = f"cost{uuid.uuid4().hex[:6]}"
    key = f"{tag}-hot"
    payload = {"key": key, "id": 0}

    def timed(calls: Callable[[int], Any]) -> tuple[float, float, Counter[str]]:
        before = _command_calls(client)
        start = time.perf_counter()
        for i in range(n):
            calls(i)
        wall = (time.perf_counter() - start) / n * 1e6
        delta = _command_calls(client)
        delta.subtract(before)
        del delta["script|load"]  # a NOSCRIPT reload is a round trip, not a command inside
        scripts = max(delta.pop("evalsha"), 1)
        return wall, delta.pop("evalsha usec") / scripts, delta

    sha = bench.trivial_sha
    holder = provider.acquire_or_enqueue(key, Signal(f"{tag}-holder", payload), TTL_MS)
    owner: dict[str, Any] = {"id": f"{tag}-holder", "token": holder.token}

    def trivial(i: int) -> None:
        provider.execute("EVALSHA", sha, 0)

    prelude_sha = str(client.script_load(prelude_only()))
    keys = provider.redis_keys(key)

    def prelude(i: int) -> None:
        provider.execute("EVALSHA", prelude_sha, len(keys), *keys, key)

    def forward(i: int) -> None:
        provider.acquire_or_enqueue(key, Signal(f"{tag}-{i}", payload), TTL_MS)

    def hand_off(i: int) -> None:
        nxt = provider.transfer_to_next(key, owner["id"], TTL_MS, token=owner["token"])
        if nxt is not None:
            owner.update(id=nxt.id, token=nxt.token)

    def acquire_release(i: int) -> None:
        got = provider.acquire_or_enqueue(f"{tag}-free", Signal(f"{tag}-f{i}", payload), TTL_MS)
        provider.transfer_to_next(f"{tag}-free", f"{tag}-f{i}", TTL_MS, token=got.token)

    rows = [
        ("trivial script `return 1`", 1, *timed(trivial)),
        ("leaseguard's shared prelude, then `return 1` (11 keys)", 1, *timed(prelude)),
        ("acquire_or_enqueue, key held: forwarded", 1, *timed(forward)),
        ("transfer_to_next, queue not empty: handed off", 1, *timed(hand_off)),
        (
            "acquire_or_enqueue (free key) + transfer_to_next (release), per pair",
            2,
            *timed(acquire_release),
        ),
    ]
    lines = [
        "| one call, one client | wall µs/call | server µs inside the script "
        "| commands the script runs | the commands, per call |",
        "|---|---:|---:|---:|---|",
    ]
    for label, scripts, wall, server_us, inside in rows:
        named = ", ".join(
            f"{name} {count / n:g}" for name, count in inside.most_common() if count > 0
        )
        lines.append(
            f"| {label} | {wall:.1f} | {server_us * scripts:.1f} "
            f"| {inside.total() / n:.1f} | {named} |"
        )
    return "\n".join(lines)


class _NoRenewer:
    """Stands in for LeaseRenewer in the diagnostic drain: no thread and no renewal at all
    (the guard starts one renewer per chain of inline runs; this shows what even that costs)."""

    def __init__(self, handle: Any, every_ms: int) -> None:
        pass

    def start(self) -> _NoRenewer:
        return self

    def follow(self, handle: Any) -> None:
        pass

    def pause(self) -> None:
        pass

    def stop(self) -> None:
        pass


@contextmanager
def no_renewer_thread() -> Iterator[None]:
    """Diagnostic only: the guard's flow without its renewer, in this process
    (a patch of the module attribute the flow looks up; the library is not changed)."""
    from leaseguard.guard import flow

    original = getattr(flow, "LeaseRenewer")  # noqa: B009
    setattr(flow, "LeaseRenewer", _NoRenewer)  # noqa: B010
    try:
        yield
    finally:
        setattr(flow, "LeaseRenewer", original)  # noqa: B010


def owner_drain_us(
    bench: Bench,
    n: int,
    *,
    take: int = 0,
    batch: int = 0,
    profile: cProfile.Profile | None = None,
) -> float:
    """µs per event of one owner running ``n`` queued events inline, in this process: the
    handler's first run queues them (as forwards would), the timer starts then. With ``take``,
    that run takes them itself, ``take_signals(take)`` at a time (the public API); with
    ``batch``, the decorator's ``drain_batch``."""
    provider = bench.provider
    key = f"drain{uuid.uuid4().hex[:8]}"
    marks: dict[str, float] = {}

    @lease_owned(
        lambda e: e["key"],
        provider=provider,
        handoff=HandoffConfig("inline", drain_batch=batch or None),
    )
    def handler(event: dict[str, Any], context: Any) -> None:
        if event["id"] == -1:
            for i in range(n):
                provider.acquire_or_enqueue(
                    key, Signal(f"{key}-{i}", {"key": key, "id": i}), TTL_MS
                )
            gc.collect()
            if profile is not None:
                profile.enable()
            marks["start"] = time.perf_counter()
            if take:
                lease = current_lease()
                while lease.take_signals(take):
                    pass

    handler({"key": key, "id": -1}, LambdaContext(aws_request_id=f"{key}-seed"))
    end = time.perf_counter()
    if profile is not None:
        profile.disable()
    return (end - marks["start"]) / n * 1e6


def bare_drain_us(bench: Bench, n: int) -> float:
    """The protocol's own floor: ``transfer_to_next`` in a loop, no guard, no handler."""
    provider = bench.provider
    key = f"bare{uuid.uuid4().hex[:8]}"
    first = provider.acquire_or_enqueue(key, Signal(f"{key}-seed", {}), TTL_MS)
    for i in range(n):
        provider.acquire_or_enqueue(key, Signal(f"{key}-{i}", {"key": key, "id": i}), TTL_MS)
    owner, token = f"{key}-seed", first.token
    gc.collect()
    start = time.perf_counter()
    while True:
        nxt = provider.transfer_to_next(key, owner, TTL_MS, token=token)
        if nxt is None:
            break
        owner, token = nxt.id, nxt.token
    return (time.perf_counter() - start) / n * 1e6


def forward_us(
    bench: Bench, n: int, *, logger: Any = None, profile: cProfile.Profile | None = None
) -> float:
    """µs per guarded call that finds the key held and forwards its event, in this process."""
    provider = bench.provider
    key = f"fwd{uuid.uuid4().hex[:8]}"
    provider.acquire_or_enqueue(key, Signal(f"{key}-holder", {}), TTL_MS)

    @lease_owned(lambda e: e["key"], provider=provider, handoff="inline", logger=logger)
    def handler(event: dict[str, Any], context: Any) -> None:
        raise AssertionError("a forwarded event must not run here")

    contexts = [LambdaContext(aws_request_id=f"{key}-{i}") for i in range(n)]
    events = [{"key": key, "id": i} for i in range(n)]
    gc.collect()
    with _stdout_to_devnull():
        if profile is not None:
            profile.enable()
        start = time.perf_counter()
        for event, context in zip(events, contexts, strict=True):
            handler(event, context)
        end = time.perf_counter()
        if profile is not None:
            profile.disable()
    return (end - start) / n * 1e6


def trivial_us(bench: Bench, n: int) -> float:
    """µs per one-at-a-time EVALSHA of the trivial script (the ceiling's unit)."""
    execute: Any = bench.provider.execute
    sha = bench.trivial_sha
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        execute("EVALSHA", sha, 0)
    return (time.perf_counter() - start) / n * 1e6


@contextmanager
def _stdout_to_devnull() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def python_cost_us(fn: Callable[[], Any], loops: int = 2000) -> float:
    """Median µs per call of ``fn`` (no I/O)."""
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - start) / loops * 1e6)
    return statistics.median(samples)


def pieces(bench: Bench) -> str:
    """What the guard does per handler run, each piece timed alone (no Redis)."""
    from leaseguard.observability import Telemetry
    from leaseguard.renewal import LeaseHandle, LeaseRenewer, lease_scope
    from leaseguard.signals import decode_signal, encode_signal

    provider = bench.provider
    handle = LeaseHandle(provider, "k", "owner", 1, TTL_MS)
    telemetry = Telemetry()
    stored = encode_signal(Signal("s", {"key": "k", "id": 1}))

    def renewer() -> None:
        LeaseRenewer(handle, TTL_MS // 3).start().stop()

    def scope() -> None:
        with lease_scope(handle), telemetry.lease_context("k", "owner", 1):
            pass

    with _stdout_to_devnull():
        log_us = python_cost_us(
            lambda: telemetry.log(
                logging.INFO,
                "forwarded event to the key's owner",
                lease_key="k",
                lease_holder="owner",
                queue_position=3,
                signal_id="s",
            )
        )
    rows = [
        ("LeaseRenewer(...).start().stop() of a run shorter than a renewal period (no thread)",
         python_cost_us(renewer, 500)),
        ("lease_scope + telemetry.lease_context (default logger: append/remove keys)",
         python_cost_us(scope)),
        ("LeaseHandle(...)", python_cost_us(lambda: LeaseHandle(provider, "k", "o", 1, TTL_MS))),
        ("decode_signal (json.loads of the stored signal)",
         python_cost_us(lambda: decode_signal("s", stored, 1, 0))),
        ("encode_signal (shape check + json.dumps)",
         python_cost_us(lambda: encode_signal(Signal("s", {"key": "k", "id": 1})))),
        ("an INFO line like the forward's (now DEBUG), default logger, to /dev/null", log_us),
        ("LambdaContext() (a uuid4 per call, bench side)", python_cost_us(LambdaContext)),
    ]  # fmt: skip
    lines = ["| piece (in this process, no Redis) | µs per call |", "|---|---:|"]
    lines += [f"| {label} | {us:.1f} |" for label, us in rows]
    return "\n".join(lines)


def top_profile(title: str, n: int, run: Callable[[cProfile.Profile], Any], limit: int) -> str:
    """cProfile's top entries by own time, per event, of ``run(profile)`` over ``n`` events."""
    profile = cProfile.Profile()
    run(profile)
    stats = pstats.Stats(profile, stream=io.StringIO())
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), entry in stats.stats.items():  # type: ignore[attr-defined]
        _, calls, tottime, cumtime, _ = entry
        where = name if path == "~" else f"{os.path.basename(path)}:{line}({name})"
        rows.append((tottime, cumtime, calls, where))
    rows.sort(reverse=True)
    lines = [
        f"cProfile of {title} ({total / n * 1e6:.0f} µs/event under the profiler), by own time:",
        "",
        "| function | calls/event | own µs/event | cumulative µs/event |",
        "|---|---:|---:|---:|",
    ]
    for tottime, cumtime, calls, where in rows[:limit]:
        lines.append(
            f"| `{where}` | {calls / n:.1f} | {tottime / n * 1e6:.1f} | {cumtime / n * 1e6:.1f} |"
        )
    return "\n".join(lines)


def profile_report(
    bench: Bench,
    keys_list: list[int],
    events: int,
    drain: int,
    take: int,
    batch: int,
    repeats: int = 5,
) -> str:
    out = ["### Round trips per event (one untimed run per key count, counted by each process)"]
    out += ["", round_trips(bench, keys_list, events), ""]
    costs = script_costs(bench)
    out += ["### The scripts, one call at a time", "", costs, ""]
    quiet = logging.getLogger("bench.quiet")
    quiet.setLevel(logging.WARNING)

    def batched(n: int) -> float:
        return owner_drain_us(bench, n, batch=batch)

    def threadless(n: int) -> float:
        with no_renewer_thread():
            return owner_drain_us(bench, n)

    variants: list[tuple[str, Callable[[int], float]]] = [
        ("one trivial EVALSHA (the ceiling's unit)", lambda n: trivial_us(bench, n)),
        ("owner drains its queue inline (the library as it is)",
         lambda n: owner_drain_us(bench, n)),
        ("the same without any renewer (diagnostic patch)", threadless),
        (f"owner drains its queue with `drain_batch={batch}`", batched),
        ("bare `transfer_to_next` loop, no guard, no handler (the protocol's floor)",
         lambda n: bare_drain_us(bench, n)),
        ("a guarded call that forwards (default logger, stdout to /dev/null)",
         lambda n: forward_us(bench, n)),
        ("a guarded call that forwards (a stdlib logger at WARNING)",
         lambda n: forward_us(bench, n, logger=quiet)),
    ]  # fmt: skip
    if take:
        variants.insert(
            4,
            (f"owner's handler takes them, `take_signals({take})` at a time (diagnostic)",
             lambda n: owner_drain_us(bench, n, take=take)),
        )  # fmt: skip
    samples: dict[str, list[float]] = {label: [] for label, _ in variants}
    for r in range(repeats):  # interleaved, the order rotated, like the rounds
        k = r % len(variants)
        for label, fn in variants[k:] + variants[:k]:
            samples[label].append(fn(drain))
    trivial = statistics.median(samples[variants[0][0]])
    out += [
        f"### The owner's drain and the forward, in this process ({drain} events, median of "
        f"{repeats} interleaved runs)",
        "",
        "| per event | µs (median) | min-max | vs trivial EVALSHA |",
        "|---|---:|---:|---:|",
    ]
    for label, _ in variants:
        us = statistics.median(samples[label])
        low, high = min(samples[label]), max(samples[label])
        out.append(f"| {label} | {us:.1f} | {low:.0f}-{high:.0f} | {trivial / us:.2f}x |")
    out += ["", "### The pieces", "", pieces(bench), ""]
    out.append(
        top_profile(
            f"one owner draining {drain} events inline",
            drain,
            lambda p: owner_drain_us(bench, drain, profile=p),
            14,
        )
    )
    out.append("")
    out.append(
        top_profile(
            f"{drain} guarded calls that forward",
            drain,
            lambda p: forward_us(bench, drain, profile=p),
            14,
        )
    )
    return "\n".join(out)


# -- output ---------------------------------------------------------------------------------------


def plot(configs: list[Config], processes: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    guarded = [
        c for c in configs if c.kind == "guarded" and not c.name.startswith("(") and not c.drain
    ]
    batched = [c for c in configs if c.kind == "guarded" and c.drain]
    diagnostics = [c for c in configs if c.kind == "guarded" and c.name.startswith("(")]
    ceiling = next(c for c in configs if c.kind == "ceiling")
    parallel = next(c for c in configs if c.kind == "parallel")
    xs = [c.keys for c in guarded]
    fig, ax = plt.subplots(figsize=(7.5, 5.2), dpi=120)
    ax.plot(xs, [c.rate() for c in guarded], "o-", label="@lease_owned events/s (median round)")
    for c in guarded:
        low, high = min(c.rates()), max(c.rates())
        ax.vlines(c.keys, low, high, color="C0", alpha=0.4)
        ax.annotate(
            f"{c.ratio_to(ceiling):.2f}x",
            (c.keys, c.rate()),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
        )
    if batched:
        label = f"@lease_owned(drain_batch={batched[0].drain}) events/s"
        ax.plot([c.keys for c in batched], [c.rate() for c in batched], "D-", color="C5",
                label=label)  # fmt: skip
        for c in batched:
            ax.vlines(c.keys, min(c.rates()), max(c.rates()), color="C5", alpha=0.4)
            ax.annotate(
                f"{c.ratio_to(ceiling):.2f}x",
                (c.keys, c.rate()),
                textcoords="offset points",
                xytext=(6, 6),
                fontsize=8,
                color="C5",
            )
    for i, c in enumerate(diagnostics):
        ax.plot([c.keys], [c.rate()], "s^v<>"[i % 5], color=f"C{3 + i}", label=c.name)
        ax.annotate(
            f"{c.ratio_to(ceiling):.2f}x",
            (c.keys, c.rate()),
            textcoords="offset points",
            xytext=(-44, -14 + 20 * i),
            fontsize=8,
            color=f"C{3 + i}",
        )
    ax.axhline(ceiling.rate(), color="C1", ls="--", label=f"ceiling: {CEILING}")
    ax.axhline(ceiling.rate() / 2, color="C1", ls=":", label="goal: 50% of the ceiling")
    usual = next(c for c in configs if c.kind == "redis-py")
    ax.axhline(usual.rate(), color="C7", ls="--", label="the same through execute_command")
    # Off the scale by 5x on 2 vCPUs: drawn, it would flatten the curves into the x axis.
    ax.plot([], [], " ", label=f"EVALSHA `return 1`, {processes} processes: "
            f"{parallel.rate():,.0f} ops/s (off the scale)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("keys (events spread round robin)")
    ax.set_ylabel("events/s, ops/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"bench/hot_key.py: {processes} processes, zero-work handler, Redis")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def machine(client: redis.Redis) -> str:
    server = client.info("server")
    cpu = "?"
    with suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    uname = " ".join(platform.uname())
    with suppress(OSError):
        done = subprocess.run(["uname", "-a"], capture_output=True, text=True, check=True)
        uname = done.stdout.strip()
    commit = "?"
    with suppress(OSError, subprocess.CalledProcessError):
        here = os.path.dirname(os.path.abspath(__file__))
        git = ["git", "-C", here]
        head = _output([*git, "rev-parse", "--short", "HEAD"])
        dirty = _output([*git, "status", "--porcelain", "--", "../leaseguard"])
        commit = f"commit {head}" + (" plus the working tree's changes" if dirty else "")
    return "\n".join(
        [
            f"- `uname -a`: {uname}",
            f"- leaseguard at {commit}",
            f"- `nproc`: {os.cpu_count()}, CPU: {cpu}",
            f"- Python {platform.python_version()} ({platform.python_implementation()}), "
            f"redis-py {redis.__version__}, {_versions('hiredis', 'aws-lambda-powertools')}",
            f"- redis-server {server['redis_version']} (`{server.get('executable', '?')}`), "
            "loopback TCP, persistence off",
            "- load average (1, 5, 15 min) at the end: "
            + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        ]
    )


def _versions(*packages: str) -> str:
    from importlib import metadata

    found = []
    for package in packages:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"no {package}")
    return ", ".join(found)


def _output(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


@contextmanager
def redis_url(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with RedisServer() as server:
        yield server.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="use this server instead of starting one")
    parser.add_argument("--processes", type=int, default=8, help="worker processes (default 8)")
    parser.add_argument(
        "--events", type=int, default=3000, help="events per configuration (default 3000)"
    )
    parser.add_argument("--keys", default="1,8,64", help="key counts (default 1,8,64)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="duration of each EVALSHA ceiling run (1.0)"
    )
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of the curve")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--no-profile", action="store_true", help="skip the profile")
    parser.add_argument(
        "--drain", type=int, default=1000, help="events per in-process drain (profile, 1000)"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=100,
        help="drain_batch of the batch-drain curve (default 100; 0 skips it)",
    )
    parser.add_argument(
        "--take",
        type=int,
        default=100,
        help="batch size of the take_signals diagnostic (default 100)",
    )
    parser.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="skip the two diagnostic 1-key runs (no renewer thread; take_signals batches)",
    )
    parser.add_argument("--start-method", default="fork", choices=("fork", "spawn", "forkserver"))
    args = parser.parse_args(argv)
    keys_list = [int(k) for k in args.keys.split(",")]

    with redis_url(args.redis_url) as url:
        prefix = f"bench-{uuid.uuid4().hex[:8]}:"
        workers = Workers(args.processes, url, prefix, args.start_method)
        bench: Bench | None = None
        try:
            bench = Bench(url, prefix, workers, args.events, args.seconds)
            configs = [Config(CEILING, "ceiling"), Config(USUAL_CEILING, "redis-py")]
            configs += [
                Config(f"@lease_owned, {k} key{'s' if k > 1 else ''}", "guarded", k)
                for k in keys_list
            ]
            if args.batch:
                configs += [
                    Config(
                        f"@lease_owned(drain_batch={args.batch}), {k} key{'s' if k > 1 else ''}",
                        "guarded",
                        k,
                        drain=args.batch,
                    )
                    for k in keys_list
                ]
            if not args.no_diagnostics:
                configs += [
                    Config("(diagnostic) 1 key, no renewer at all", "guarded", 1,
                           threadless=True),
                    Config(f"(diagnostic) 1 key, handler drains with take_signals({args.take})",
                           "guarded", 1, take=args.take),
                ]  # fmt: skip
            configs.append(Config(f"EVALSHA `return 1`, {args.processes} processes", "parallel"))
            run_rounds(bench, configs, args.rounds)
            report = ""
            if not args.no_profile:
                report = profile_report(
                    bench, keys_list, args.events, args.drain, args.take, args.batch or 100
                )
        finally:
            workers.close()
            if bench is not None:
                bench.cleanup()

        ceiling, usual = configs[0], configs[1]
        print(
            f"{args.processes} processes, {args.events} events per configuration, "
            f"{args.rounds} rounds (interleaved, order rotated), median round; "
            f"EVALSHA runs last {args.seconds:.1f} s\n"
        )
        print(table(configs, args.processes))
        print()
        for c in configs:
            if c.kind == "guarded":
                ratio, vs_usual = c.ratio_to(ceiling), c.ratio_to(usual)
                verdict = "met" if ratio >= 0.5 else "missed"
                print(
                    f"- {c.name}: **{ratio:.2f}x** the one-client ceiling ({verdict}); "
                    f"{vs_usual:.2f}x the same loop through redis-py's execute_command"
                    f" ({'met' if vs_usual >= 0.5 else 'missed'})"
                )
        if report:
            print()
            print(report)
        print()
        print(machine(bench.client))
        print(f"- command: `{' '.join([os.path.relpath(sys.executable), *sys.argv])}`")
        if args.plot:
            plot(configs, args.processes, args.plot)
            print(f"- plot: {args.plot}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "args": vars(args),
                        "configs": [
                            {
                                "name": c.name,
                                "kind": c.kind,
                                "keys": c.keys,
                                "drain": c.drain,
                                "take": c.take,
                                "threadless": c.threadless,
                                "seconds": c.seconds,
                                "ops": c.ops,
                                "stats": c.stats,
                                "median_rate": c.rate(),
                            }
                            for c in configs
                        ],
                        "violations": bench.violations,
                    },
                    f,
                    indent=2,
                )
        if bench.violations:
            print(f"\n{len(bench.violations)} VIOLATIONS: events lost, repeated or keys not idle")
            for v in bench.violations:
                print(f"- {v}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
