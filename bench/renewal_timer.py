"""What a renewer costs a run that ends before its first renewal: the cost of a busy key.

Runs ``--runs`` guarded-style runs back to back in this process, each a ``LeaseRenewer``
started on a lease, a short wait that gives up the GIL as a handler's I/O does (``--run-us``),
and ``stop()``; the renewal period is ``--period-ms``, so the later runs start long after the
first ones were due. Reports per run the wall and CPU time beyond the wait, how many renewer
threads were started (none should be), and how many times the shared timer thread went to
sleep (``renewal._DeferredStarts``: about twice a period is the design, once a run was the
bug). Runs against the in-memory provider: no backend call is made, since none is due.

    .venv/bin/python bench/renewal_timer.py
    PYTHONPATH=/path/to/an/older/checkout .venv/bin/python bench/renewal_timer.py  # before
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

from leaseguard import InMemoryLeaseProvider, renewal
from leaseguard.renewal import LeaseHandle, LeaseRenewer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6000, help="runs (default 6000)")
    parser.add_argument("--period-ms", type=int, default=100, help="renewal period (100)")
    parser.add_argument("--run-us", type=int, default=200, help="each run's wait (200 µs)")
    args = parser.parse_args(argv)

    sleeps = [0]
    timer = getattr(renewal, "_DEFERRED_STARTS", None)
    if timer is not None:  # count the timer's sleeps (an older checkout has no timer)

        class CountingCondition(threading.Condition):
            def wait(self, timeout: float | None = None) -> bool:
                sleeps[0] += 1
                return super().wait(timeout)

        timer._reset()
        timer._cond = CountingCondition()
    started = [0]
    real_start = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        if thread.name.startswith("leaseguard-renew"):
            started[0] += 1
        real_start(thread)

    threading.Thread.start = counting_start  # type: ignore[method-assign]
    provider = InMemoryLeaseProvider()
    lease = provider.acquire_lease("k", "o", 60_000)
    handle = LeaseHandle(provider, "k", "o", lease.token, 60_000)
    wait_s = args.run_us / 1e6
    bare_wall, bare_cpu = [], []  # the same loop without a renewer, to subtract
    for _ in range(200):
        w, c = time.perf_counter(), time.process_time()
        time.sleep(wait_s)
        bare_wall.append(time.perf_counter() - w)
        bare_cpu.append(time.process_time() - c)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.runs):
        renewer = LeaseRenewer(handle, args.period_ms).start()
        time.sleep(wait_s)
        renewer.stop()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    per_wall = wall / args.runs - statistics.median(bare_wall)
    per_cpu = cpu / args.runs - statistics.median(bare_cpu)
    total_s = wall
    print(f"{args.runs} runs back to back, {args.run_us} µs each, renewal period "
          f"{args.period_ms} ms ({total_s / (args.period_ms / 1000):.0f} periods)\n")  # fmt: skip
    print("| per run, beyond its wait | value |")
    print("|---|---:|")
    print(f"| wall µs | {per_wall * 1e6:.1f} |")
    print(f"| CPU µs | {per_cpu * 1e6:.1f} |")
    print(f"| renewer threads started (all runs) | {started[0]} |")
    print(f"| timer sleeps (all runs) | {sleeps[0] if timer is not None else 'no timer'} |")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"\n- Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.2f}, leaseguard from {os.path.dirname(renewal.__file__)}, "
          f"checkout at {commit or '?'}")  # fmt: skip
    print(f"- command: `{' '.join([os.path.relpath(sys.executable), *sys.argv])}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
