"""``leaseguard inspect KEY``: who holds a key, its token and remaining TTL, and the signals
queued behind it (ids, ages, sizes) and in flight."""

from __future__ import annotations

import argparse
import json
from typing import Any

from leaseguard.cli.backends import add_backend_arguments, open_backend
from leaseguard.signals import KeyState, now_ms


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "inspect", help="show the holder, token, TTL and queue of a key", description=__doc__
    )
    parser.add_argument("key", nargs="+", help="one or more lease keys")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_backend_arguments(parser, embedded=False)
    parser.set_defaults(run=run)


def describe(state: KeyState) -> dict[str, Any]:
    now = now_ms()
    return {
        "key": state.key,
        "owner": state.owner,
        "token": state.token,
        "remaining_ms": state.remaining_ms,
        "queued": [
            {
                "id": s.id,
                "age_ms": max(now - s.enqueued_at_ms, 0),
                "bytes": len(json.dumps(s.payload, separators=(",", ":")).encode()),
            }
            for s in state.queued
        ],
        "in_flight": list(state.in_flight),
    }


def render(info: dict[str, Any]) -> str:
    lines = [f"key        {info['key']!r}"]
    if info["owner"] is None:
        lines.append("holder     (free)")
    else:
        lines.append(f"holder     {info['owner']}")
        lines.append(f"token      {info['token']}")
        lines.append(f"ttl left   {info['remaining_ms']} ms")
    lines.append(f"queued     {len(info['queued'])}")
    for signal in info["queued"]:
        lines.append(f"  - {signal['id']}  age {signal['age_ms']} ms  {signal['bytes']} bytes")
    if info["in_flight"]:
        lines.append(f"in flight  {', '.join(info['in_flight'])}")
    return "\n".join(lines)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with open_backend(args, embedded=False) as (config, _):
        provider = config.build()
        infos = [describe(provider.inspect_key(key)) for key in args.key]
    if args.json:
        print(json.dumps(infos if len(infos) > 1 else infos[0], indent=2))
    else:
        print("\n\n".join(render(info) for info in infos))
    return 0
