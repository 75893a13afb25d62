"""leaseguard dead-letters: the keys that hold dead letters (signals whose handler failed
max_attempts times), with how many each holds and whether the key is halted. Read from the
backend's index of such keys, never a scan of every key. Look at one with leaseguard inspect
KEY; put its dead letters back with leaseguard redrive KEY."""

from __future__ import annotations

import argparse
import json
from typing import Any

from leaseguard.cli.backends import add_backend_arguments, build_provider, open_backend
from leaseguard.cli.text import word


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "dead-letters", help="list the keys that hold dead letters", description=__doc__
    )
    parser.add_argument(
        "--limit", type=int, default=100, metavar="N", help="most keys to list (default 100)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_backend_arguments(parser, embedded=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.limit <= 0:
        parser.error("--limit must be positive")
    with open_backend(args, embedded=False) as (config, _):
        provider = build_provider(config)
        keys = sorted(provider.dead_letter_keys(args.limit))
        rows: list[dict[str, Any]] = []
        for key in keys:
            state = provider.inspect_key(key)
            rows.append(
                {"key": key, "dead_letters": len(state.dead_letters), "halted": state.halted}
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no key holds dead letters")
        return 0
    print(f"{'dead':>5}  {'halted':<6}  key")
    for row in rows:
        print(f"{row['dead_letters']:>5}  {'yes' if row['halted'] else '':<6}  {word(row['key'])}")
    if len(rows) >= args.limit:
        print(f"(the first {args.limit} keys; --limit N shows more)")
    return 0
