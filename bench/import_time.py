"""What ``import leaseguard`` costs a cold start, and what the first guarded invocation adds.

Every figure comes from fresh interpreters (``sys.executable``), as a Lambda cold start has:

* **import**: the wall time of ``python -c 'import leaseguard'`` minus that of
  ``python -c pass`` (the median of ``--runs`` runs of each, interleaved so that drift hits both
  alike), the same for ``from leaseguard import lease_owned``, and the modules each loads
  beyond the bare interpreter. Beside the wall time: the child's CPU time (user + system) minus
  the bare one's, and the import statement alone timed inside the child; on a busy machine both
  move less than the wall time.
* **first invocation**, per backend: a child times, one after the other, ``import leaseguard``,
  resolving ``leaseguard.lease_owned`` (the guard's import chain), decorating a handler (the
  default Powertools logger and metrics when Powertools is installed), ``provider_from_env()``
  (the provider the guard builds on its first call: the provider module, the client library's
  import, the client), the first guarded call (on Redis: the connection and the scripts'
  ``NOSCRIPT`` + ``SCRIPT LOAD`` + retry; on DynamoDB: the first HTTP requests), then a second
  call for comparison, and lists what the first call still imported. Redis is a real
  ``redis-server`` (:class:`~leaseguard.testing.RedisServer`, its script cache flushed before
  every run); DynamoDB is moto's server in a separate process
  (:class:`~leaseguard.testing.DynamoDBServer`), so the child pays boto3's import and client
  construction as a function does, and only the HTTP hop is local.

Before every measurement one untimed run writes the bytecode caches (``PYTHONDONTWRITEBYTECODE``
is dropped from the children's environment): a deployed package is measured with its ``.pyc``
files, not with a compile on every start.

    .venv/bin/python bench/import_time.py                  # import + Redis + DynamoDB
    .venv/bin/python bench/import_time.py --skip-backends  # import only

Numbers are never asserted anywhere (tests/test_import_cost.py pins which modules load, not how
long it takes); docs/benchmarks.md holds recorded runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

IMPORTS = {
    "import leaseguard": "import leaseguard",
    "from leaseguard import lease_owned": "from leaseguard import lease_owned",
}
BARE = "pass"
# The statement alone, timed inside the child: no interpreter start-up or exit around it.
TIMED = "import time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
MODULES = "{code}\nimport sys; print(' '.join(sorted(sys.modules)))"  # json would hide json

# The child of a first-invocation run: one cold start, timed from inside.
FIRST_CALL = """
import json, sys, time

class LambdaContext:  # leaseguard.testing's would add its own imports to the figures
    def __init__(self, call):
        self.aws_request_id = f"bench-{sys.argv[1]}-{call}"

    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    deadline = time.monotonic() + 30

    def get_remaining_time_in_millis(self):
        return int(1000 * (self.deadline - time.monotonic()))

t0 = time.perf_counter()
import leaseguard
t1 = time.perf_counter()
lease_owned = leaseguard.lease_owned
t2 = time.perf_counter()

@lease_owned(lambda event: event["key"])
def handler(event, context):
    return "ok"

t3 = time.perf_counter()
from leaseguard.config import provider_from_env
provider_from_env()
t4 = time.perf_counter()
before = set(sys.modules)
key = "bench-import-" + sys.argv[1]
assert handler({"key": key}, LambdaContext(1)) == "ok"
t5 = time.perf_counter()
assert handler({"key": key}, LambdaContext(2)) == "ok"
t6 = time.perf_counter()
print(json.dumps({
    "times": [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5],
    "first call loads": sorted({m.split(".")[0] for m in set(sys.modules) - before}),
}))
"""
PHASES = (
    "import leaseguard",
    "leaseguard.lease_owned (guard chain)",
    "@lease_owned(...) decoration",
    "provider_from_env() (module, client)",
    "first guarded call",
    "second guarded call",
)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEASEGUARD_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra or {})
    return env


def run_child(args: list[str], env: Mapping[str, str]) -> tuple[float, float, str]:
    """(wall s, child CPU s, stdout) of one ``python`` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{args!r} failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def measure_imports(runs: int) -> list[tuple[str, float, float, float, int]]:
    """(label, extra wall ms, extra CPU ms, in-process ms, extra modules) for each of
    :data:`IMPORTS`."""
    env = child_env()
    codes = {"bare": BARE, **IMPORTS}
    for code in codes.values():
        run_child(["-c", code], env)  # writes the .pyc files
    walls: dict[str, list[float]] = {label: [] for label in codes}
    cpus: dict[str, list[float]] = {label: [] for label in codes}
    inside: dict[str, list[float]] = {label: [] for label in codes}
    for _ in range(runs):
        for label, code in codes.items():
            wall, cpu, out = run_child(["-c", TIMED.format(code=code)], env)
            walls[label].append(wall)
            cpus[label].append(cpu)
            inside[label].append(float(out))
    bare_modules = set(run_child(["-c", MODULES.format(code=BARE)], env)[2].split())
    rows = []
    for label, code in IMPORTS.items():
        loaded = set(run_child(["-c", MODULES.format(code=code)], env)[2].split())
        rows.append(
            (
                label,
                1000 * (statistics.median(walls[label]) - statistics.median(walls["bare"])),
                1000 * (statistics.median(cpus[label]) - statistics.median(cpus["bare"])),
                1000 * statistics.median(inside[label]),
                len(loaded - bare_modules),
            )
        )
    return rows


def measure_first_call(
    env_extra: Mapping[str, str], runs: int, before_run: Callable[[], object]
) -> tuple[list[float], list[str]]:
    """Median seconds of each of :data:`PHASES` over ``runs`` cold starts, and the top-level
    packages the first guarded call imported (in the last run)."""
    env = child_env(env_extra)
    samples: list[list[float]] = [[] for _ in PHASES]
    loads: list[str] = []
    for i in range(runs + 1):
        before_run()
        out = json.loads(run_child(["-c", FIRST_CALL, f"{os.getpid()}-{i}"], env)[2])
        if i == 0:
            continue  # the untimed run: bytecode caches, the table's first items
        for phase, seconds in enumerate(out["times"]):
            samples[phase].append(seconds)
        loads = out["first call loads"]
    return [statistics.median(values) for values in samples], loads


def redis_first_call(runs: int) -> tuple[list[float], list[str]]:
    import redis

    from leaseguard.testing import RedisServer

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            return measure_first_call(
                {"LEASEGUARD_BACKEND": "redis", "LEASEGUARD_REDIS_URL": server.url},
                runs,
                client.script_flush,  # every run loads its scripts, as a new server would
            )
        finally:
            client.close()


def dynamodb_first_call(runs: int) -> tuple[list[float], list[str]]:
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
    from leaseguard.testing import DynamoDBServer

    credentials = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(credentials)
    with DynamoDBServer() as server:
        table = "leaseguard-import-bench"
        DynamoDBLeaseProvider(
            table, endpoint_url=server.endpoint_url, region_name="us-east-1"
        ).create_table()
        return measure_first_call(
            {
                **credentials,
                "LEASEGUARD_BACKEND": "dynamodb",
                "LEASEGUARD_TABLE_NAME": table,
                "LEASEGUARD_DYNAMODB_ENDPOINT": server.endpoint_url,
            },
            runs,
            lambda: None,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per figure (median)")
    parser.add_argument(
        "--skip-backends", action="store_true", help="import figures only, no Redis/DynamoDB"
    )
    args = parser.parse_args(argv)

    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"median of {args.runs} runs, {time.strftime('%Y-%m-%d')}, "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} at the start"
    )
    print()
    print(
        "| import (fresh interpreter)           | wall - bare | CPU - bare "
        "| the statement alone | modules - bare |"
    )
    print(
        "|--------------------------------------|------------:|-----------:"
        "|--------------------:|---------------:|"
    )
    for label, wall_ms, cpu_ms, inside_ms, modules in measure_imports(args.runs):
        print(
            f"| `{label}`{' ' * (34 - len(label))} | {wall_ms:8.1f} ms | "
            f"{cpu_ms:7.1f} ms | {inside_ms:16.1f} ms | {modules:14d} |"
        )
    if args.skip_backends:
        return
    results = {
        "Redis": redis_first_call(args.runs),
        "DynamoDB": dynamodb_first_call(args.runs),
    }
    print()
    print("| cold start, timed in the child (ms)  | " + " | ".join(results) + " |")
    print("|--------------------------------------|" + "|".join("-------:" for _ in results) + "|")
    for phase, label in enumerate(PHASES):
        cells = " | ".join(f"{1000 * times[phase]:.1f}" for times, _ in results.values())
        print(f"| {label:36} | {cells} |")
    print()
    for backend, (_, loads) in results.items():
        print(f"{backend}: the first guarded call imported {', '.join(loads) or 'nothing'}")
    print(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
