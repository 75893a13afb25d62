"""leaseguard simulate: many concurrent guarded invocations over a few keys, across OS
processes, on a real backend; then an independent check that no key ever had two owners at
once, fencing tokens only rose, every event was handled exactly once (at least once with
--kill-rate, duplicates explained), and forwarded events ran in arrival order.

The backend is checked with one read before the run starts, so an unreachable one fails at
once. With --dynamodb-endpoint the --table must exist, unless --create-table is given.

Exit status: 0 verified, 1 a violation (or the run did not settle) or a backend failure,
2 bad arguments or configuration."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from leaseguard.cli.backends import add_backend_arguments, build_provider, open_backend
from leaseguard.cli.text import escape, quote


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "simulate",
        help="race many guarded invocations and verify the invariants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    load = parser.add_argument_group("load")
    load.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    load.add_argument("--invocations", type=int, default=400, help="events to send (default 400)")
    load.add_argument("--keys", type=int, default=6, help="distinct keys (default 6)")
    load.add_argument(
        "--work-ms",
        default="5-40",
        metavar="MIN-MAX",
        help="handler duration range in ms (default 5-40)",
    )
    load.add_argument("--burst", type=int, default=8, help="mean events per burst (default 8)")
    load.add_argument(
        "--kill-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="chance a handler run is SIGKILLed mid-work (default 0)",
    )
    load.add_argument("--ttl-ms", type=int, default=1_000, help="lease TTL (default 1000)")
    load.add_argument(
        "--drain-batch",
        type=int,
        default=0,
        metavar="N",
        help="the decorator's drain_batch: owners run up to N queued events per grant (default 0)",
    )
    load.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    out = parser.add_argument_group("output")
    out.add_argument("--plot", metavar="FILE.png", help="write the timeline picture")
    out.add_argument("--json", metavar="FILE", help="write the raw results")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    add_backend_arguments(parser, embedded=True)
    parser.set_defaults(run=run)


def _work_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        bounds = (int(low), int(high if sep else low))
    except ValueError as exc:
        raise ValueError(f"--work-ms must look like 5-40, got {text!r}") from exc
    if bounds[0] < 0 or bounds[0] > bounds[1]:
        raise ValueError(f"--work-ms must be MIN-MAX with 0 <= MIN <= MAX, got {text!r}")
    return bounds


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from leaseguard.config import ProviderConfig
    from leaseguard.errors import extra_required
    from leaseguard.simulate.engine import SimulationConfig

    # Before any server starts: a run that cannot print its report, or draw its picture,
    # should say which extra to install at once, not after the whole simulation.
    with extra_required("cli", "the simulator's report"):
        import rich  # noqa: F401

        if args.plot:
            import matplotlib  # noqa: F401
    try:
        if args.plot and not args.plot.lower().endswith(".png"):
            raise ValueError("--plot must name a .png file")
        for name in ("workers", "invocations", "keys", "burst", "ttl_ms"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if args.memory and args.kill_rate:
            raise ValueError("--kill-rate needs worker processes; --memory runs threads")
        # Checked before any server starts (the backend is filled in below): a typo should not
        # cost a Redis start-up.
        draft = SimulationConfig(
            provider=ProviderConfig(backend="noop"),
            workers=args.workers,
            invocations=args.invocations,
            keys=args.keys,
            work_ms=_work_range(args.work_ms),
            kill_rate=args.kill_rate,
            ttl_ms=args.ttl_ms,
            drain_batch=args.drain_batch,
            burst=args.burst,
            seed=args.seed,
            lambda_timeout_ms=max(1_500, args.ttl_ms + 500),
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.create_table and not args.dynamodb_endpoint:
        parser.error("--create-table needs --dynamodb-endpoint")
    with open_backend(args, embedded=True) as (provider, description):
        threads = provider.backend == "memory"
        if not threads:
            build_provider(provider, check=True)  # unreachable: fail now, not in every worker
        config = dataclasses.replace(draft, provider=provider, threads=threads)
        return _simulate(config, description, args)


def _simulate(config: Any, description: str, args: argparse.Namespace) -> int:
    from leaseguard.errors import extra_required

    with extra_required("cli", "the simulator's report"):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from leaseguard.simulate.checker import check
    from leaseguard.simulate.engine import Simulation
    from leaseguard.simulate.summary import summarize

    console = Console()
    unit = "threads" if config.threads else "processes"
    console.print(
        f"[bold]leaseguard simulate[/]: {config.invocations} invocations over {config.keys} "
        f"keys from {config.workers} worker {unit} on {_shown(description)}"
        + (f", kill rate {config.kill_rate:g}" if config.kill_rate else "")
    )
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
        transient=True,
    ) as progress:
        task = progress.add_task("invocations", total=config.invocations)
        simulation = Simulation(
            config, progress=lambda done, _: progress.update(task, completed=done)
        )
        result = simulation.run()
        progress.update(task, description="verifying")
    report = check(result.records, [e["id"] for e in result.events])
    summary = summarize(result, report)
    _print_summary(console, summary)
    ok = report.ok and result.quiesced
    _print_verdict(console, report, result)
    if args.plot:
        from leaseguard.simulate.plot import plot_timeline

        path = plot_timeline(result, report, args.plot)
        console.print(f"timeline written to [bold]{_shown(str(path))}[/]")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "summary": summary.as_dict(),
                    "verified": ok,
                    "violations": [v.__dict__ for v in report.violations],
                    "stuck": result.stuck,
                    "unfinished": result.unfinished,
                    "records": result.records,
                }
            )
        )
        console.print(f"raw results written to [bold]{_shown(args.json)}[/]")
    return 0 if ok else 1


def _print_summary(console: Any, summary: Any) -> None:
    from leaseguard.errors import extra_required

    with extra_required("cli", "the simulator's report"):
        from rich.table import Table

    table = Table(title="summary", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    from leaseguard.simulate.summary import arrival_rows

    # First how each event's first delivery was answered (these add up to the invocations),
    # then what happened to the events afterwards (counts of runs and hand-offs, which do not).
    rows: list[tuple[str, Any]] = [
        ("invocations", summary.invocations),
        *(("  " + name, count) for name, count in arrival_rows(summary)),
        ("drained by the owner (take_signals)", summary.drained_by_owner),
        ("handed off inline", summary.handed_off_inline),
        ("handed off by async invoke", summary.handed_off_by_invoke),
        ("orphaned keys adopted by the sweeper", summary.adopted_by_sweeper),
        ("queue heads run first by an arrival (key free)", summary.adopted_on_arrival),
        ("workers killed", summary.kills),
        ("re-runs after a kill (explained)", summary.explained_duplicates),
        ("leases lost", summary.lease_lost),
        ("wait p50 / p99", f"{summary.wait_p50_ms} / {summary.wait_p99_ms} ms"),
        ("hold p50 / p99", f"{summary.hold_p50_ms} / {summary.hold_p99_ms} ms"),
        ("throughput", f"{summary.throughput_per_s} events/s"),
        ("wall time", f"{summary.wall_s} s"),
    ]
    if summary.overlaps_after_lapse or summary.reruns_after_lapse:
        at = rows.index(("leases lost", summary.lease_lost)) + 1
        rows[at:at] = [
            ("overlaps after a lapse (explained)", summary.overlaps_after_lapse),
            ("re-runs after a lapse (explained)", summary.reruns_after_lapse),
        ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)


def _print_verdict(console: Any, report: Any, result: Any) -> None:
    if report.ok and result.quiesced and (report.overlaps_after_lapse or report.reruns_after_lapse):
        console.print(
            "[bold green]verified[/]: never two owners of a key while a lease was certainly held, "
            "fencing tokens strictly increasing, every event handled at least once (re-runs only "
            "after kills or lapsed leases), forwarded events in arrival order"
        )
        console.print(
            f"[yellow]{report.lapsed_grants} lease(s) lapsed[/]: a renewal came later than the "
            "TTL (an overloaded machine, or a TTL too short for it). What ran after a lapse is "
            "what the protocol allows (docs/safety.md); a longer --ttl-ms avoids it."
        )
        return
    if report.ok and result.quiesced:
        console.print(
            "[bold green]verified[/]: never two owners of a key at once, fencing tokens "
            "strictly increasing, every event handled "
            + ("at least once (re-runs only after kills)" if result.kills else "exactly once")
            + ", forwarded events in arrival order"
        )
        return
    if not result.quiesced:
        console.print(
            f"[bold red]did not settle[/]: keys still busy: {_shown(str(result.stuck))}; "
            f"invocations unfinished: {result.unfinished}"
        )
    counts = report.by_kind()
    console.print(f"[bold red]{len(report.violations)} violation(s)[/]: {dict(counts)}")
    for violation in report.violations[:20]:
        console.print(
            f"  [red]{_shown(violation.kind)}[/] on {_shown(quote(violation.key))}: "
            f"{_shown(violation.detail)}"
        )
    if len(report.violations) > 20:
        console.print(f"  ... and {len(report.violations) - 20} more (--json has them all)")


def _shown(text: str) -> str:
    """Text from outside (a key, a violation's detail, a path) in a rich markup string:
    escaped (leaseguard.cli.text), and its brackets kept from being read as markup."""
    from leaseguard.errors import extra_required

    with extra_required("cli", "the simulator's report"):
        from rich.markup import escape as markup_escape

    return markup_escape(escape(text))
