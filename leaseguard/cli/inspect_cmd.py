"""leaseguard inspect KEY...: who holds a key, its token and remaining TTL, the signals queued
behind it (ids, ages, sizes) and in flight, its dead letters (id, attempts, last error, when it
was queued and when it failed, a preview of the payload), and whether it is halted. Reads only:
it changes nothing and never creates a table."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from leaseguard.cli.backends import add_backend_arguments, build_provider, open_backend
from leaseguard.cli.text import escape, json_line, quote, shell_word, word
from leaseguard.types import KeyState, now_ms

PREVIEW_CHARS = 80
ERROR_CHARS = 200


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "inspect",
        help="show the holder, token, TTL, queue and dead letters of a key",
        description=__doc__,
    )
    parser.add_argument("key", nargs="+", help="one or more lease keys")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_backend_arguments(parser, embedded=False)
    parser.set_defaults(run=run)


def _size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (a lone surrogate, which JSON can carry,
    counted as its three bytes rather than crashing the count)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass"))


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
                "bytes": _size(s.payload),
            }
            for s in state.queued
        ],
        "in_flight": list(state.in_flight),
        "dead_letters": [
            {
                "id": d.id,
                "attempts": d.attempts,
                "error": d.error,
                "enqueued_at_ms": d.enqueued_at_ms,
                "failed_at_ms": d.failed_at_ms,
                "payload": d.payload,
            }
            for d in state.dead_letters
        ],
        "halted": state.halted,
    }


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _when(ms: int, now: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} ({_ago(now - ms)})"


def _ago(ms: int) -> str:
    if ms < 0:
        return "in the future"
    seconds = ms // 1000
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172_800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86_400} days ago"


def render(info: dict[str, Any]) -> str:
    now = now_ms()
    lines = [f"key        {quote(info['key'])}"]
    if info["owner"] is None:
        lines.append("holder     (free)")
    else:
        lines.append(f"holder     {word(info['owner'])}")
        lines.append(f"token      {info['token']}")
        lines.append(f"ttl left   {info['remaining_ms']} ms")
    if info["halted"]:
        lines.append(
            "halted     yes: nothing queued runs until "
            f"leaseguard redrive {shell_word(info['key'])}"
        )
    lines.append(f"queued     {len(info['queued'])}")
    for signal in info["queued"]:
        lines.append(
            f"  - {word(signal['id'])}  age {signal['age_ms']} ms  {signal['bytes']} bytes"
        )
    if info["in_flight"]:
        lines.append(f"in flight  {', '.join(word(sid) for sid in info['in_flight'])}")
    dead = info["dead_letters"]
    lines.append(f"dead       {len(dead)}")
    for letter in dead:
        payload = json_line(letter["payload"])
        size = _size(letter["payload"])
        lines.append(f"  - {word(letter['id'])}  attempts {letter['attempts']}")
        lines.append(f"      failed   {_when(letter['failed_at_ms'], now)}")
        lines.append(f"      queued   {_when(letter['enqueued_at_ms'], now)}")
        lines.append(f"      error    {escape(_clip(letter['error'], ERROR_CHARS))}")
        lines.append(f"      payload  {_clip(payload, PREVIEW_CHARS)}  ({size} bytes)")
    return "\n".join(lines)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with open_backend(args, embedded=False) as (config, _):
        provider = build_provider(config)
        infos = [describe(provider.inspect_key(key)) for key in args.key]
    if args.json:
        print(json.dumps(infos if len(infos) > 1 else infos[0], indent=2))
    else:
        print("\n\n".join(render(info) for info in infos))
    return 0
