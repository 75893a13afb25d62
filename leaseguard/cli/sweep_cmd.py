"""``leaseguard sweep``: one sweeper pass. Keys whose owner died with signals pending are
adopted (the head signal becomes owner) and each adopted signal is sent, as a handoff envelope,
to a function by async Invoke, to an SQS queue, or printed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from leaseguard.cli.backends import add_backend_arguments, open_backend
from leaseguard.config import DEFAULT_TTL_MS
from leaseguard.handoff import Envelope, InvokeDispatcher, SqsDispatcher, dispatch_orphans


class _PrintDispatcher:
    def dispatch(self, envelope: Envelope) -> None:
        print(json.dumps(envelope.to_event()))


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "sweep", help="adopt orphaned keys and dispatch their signals", description=__doc__
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--function", metavar="NAME_OR_ARN", help="async Invoke this function")
    target.add_argument("--queue-url", metavar="URL", help="send to this SQS queue")
    target.add_argument(
        "--print",
        action="store_true",
        help="print the envelopes (feed them to `leaseguard invoke` within the TTL)",
    )
    parser.add_argument(
        "--ttl-ms", type=int, default=DEFAULT_TTL_MS, help="lease TTL of the grants"
    )
    parser.add_argument("--limit", type=int, default=100, help="most keys to adopt")
    add_backend_arguments(parser, embedded=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.limit <= 0 or args.ttl_ms <= 0:
        parser.error("--limit and --ttl-ms must be positive")
    dispatcher: Any
    if args.function:
        dispatcher = InvokeDispatcher(args.function)
    elif args.queue_url:
        dispatcher = SqsDispatcher(args.queue_url)
    else:
        dispatcher = _PrintDispatcher()
    with open_backend(args, embedded=False) as (config, _):
        sent = dispatch_orphans(config.build(), dispatcher, args.ttl_ms, args.limit)
    if not args.print:
        print(f"adopted and dispatched {len(sent)} signal(s)")
    return 0
