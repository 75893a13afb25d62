"""leaseguard sweep: one sweeper pass. Keys whose owner died with signals pending are adopted
(the head signal becomes owner) and each adopted signal is sent, as a handoff envelope, to a
function by async Invoke, to an SQS queue, or printed.

AWS credentials and region are checked before any key is adopted. A signal that could not be
sent is reported on stderr (one line each) and the exit status is 1; its grant expires
unclaimed and the next pass adopts it again."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from leaseguard import aws
from leaseguard.cli.backends import add_backend_arguments, build_provider, open_backend
from leaseguard.cli.text import escape, quote
from leaseguard.config import DEFAULT_TTL_MS
from leaseguard.errors import ConfigurationError, LeaseBackendError
from leaseguard.handoff import Envelope, InvokeDispatcher, SqsDispatcher


class _PrintDispatcher:
    def dispatch(self, envelope: Envelope) -> None:
        print(json.dumps(envelope.to_event()), flush=True)


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "sweep",
        help="adopt orphaned keys and dispatch their signals",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--function", metavar="NAME_OR_ARN", help="async Invoke this function")
    target.add_argument("--queue-url", metavar="URL", help="send to this SQS queue")
    target.add_argument(
        "--print",
        action="store_true",
        help="print the envelopes (feed them to leaseguard invoke within the TTL)",
    )
    parser.add_argument(
        "--ttl-ms", type=int, default=DEFAULT_TTL_MS, help="lease TTL of the grants"
    )
    parser.add_argument("--limit", type=int, default=100, help="most keys to adopt")
    add_backend_arguments(parser, embedded=False)
    parser.set_defaults(run=run)


def aws_client(service: str, purpose: str) -> Any:
    """A boto3 client for ``service``, or a :class:`ConfigurationError` naming what to set
    when no credentials or no region are configured (checked before anything is adopted)."""
    session = aws.session()
    region = session.region_name or os.environ.get("AWS_REGION") or None
    if session.get_credentials() is None:
        raise ConfigurationError(
            f"no AWS credentials found for {purpose}: set AWS_PROFILE, or AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY"
        )
    if region is None:
        raise ConfigurationError(f"no AWS region configured for {purpose}: set AWS_REGION")
    return aws.client(service, region_name=region)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.limit <= 0 or args.ttl_ms <= 0:
        parser.error("--limit and --ttl-ms must be positive")
    dispatcher: Any
    if args.function:
        client = aws_client("lambda", f"invoking {args.function}")
        dispatcher = InvokeDispatcher(args.function, client=client)
    elif args.queue_url:
        client = aws_client("sqs", f"sending to {args.queue_url}")
        dispatcher = SqsDispatcher(args.queue_url, client=client)
    else:
        dispatcher = _PrintDispatcher()
    sent = failed = 0
    with open_backend(args, embedded=False) as (config, _):
        provider = build_provider(config)
        for key, signal in provider.adopt_orphans(args.ttl_ms, args.limit, claim=False):
            envelope = Envelope(key, signal.id, signal.token or 0, signal.payload)
            try:
                dispatcher.dispatch(envelope)
            except LeaseBackendError as exc:
                failed += 1
                detail = escape(" ".join(str(exc).split()))
                print(
                    f"leaseguard sweep: error: could not dispatch signal {quote(signal.id)} of "
                    f"key {quote(key)}: {detail}; the next pass adopts it again once its grant "
                    "expires",
                    file=sys.stderr,
                )
                continue
            sent += 1
    if not args.print:
        print(f"adopted and dispatched {sent} signal(s)" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0
