"""leaseguard create-table [--table NAME] [--dynamodb-endpoint URL]: create the DynamoDB table
leaseguard's DynamoDB backend uses (on-demand billing, the ``orphans`` and ``dead_letters``
indexes, TTL on ``ttl``; the schema is in docs/dynamodb.md), in the region of the AWS
environment (AWS_REGION) or at an endpoint (DynamoDB Local, moto). A deployed stack creates its
own (template.yaml's LeaseTable); this is for a first try, a test account or local testing.

Idempotent: a table that exists is checked for the two indexes (an error names the missing
one) and for TTL (enabled if it is off), and left otherwise as it is.

Exit status 0 when the table exists afterwards (created or found), 1 when DynamoDB failed, 2
for bad arguments, missing credentials, or a table of that name without the indexes."""

from __future__ import annotations

import argparse
import os
from typing import Any

from leaseguard.cli.text import escape, quote
from leaseguard.errors import ConfigurationError, InvalidLeaseArgument


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "create-table",
        help="create the DynamoDB table (idempotent)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        help="table name (default: LEASEGUARD_TABLE_NAME, else leaseguard)",
    )
    parser.add_argument(
        "--dynamodb-endpoint",
        metavar="URL",
        help="DynamoDB endpoint (default: LEASEGUARD_DYNAMODB_ENDPOINT, else AWS)",
    )
    parser.add_argument(
        "--no-wait", action="store_true", help="return once DynamoDB accepted the request"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from leaseguard.config import ProviderConfig
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

    env = os.environ
    name = args.table or env.get("LEASEGUARD_TABLE_NAME") or "leaseguard"
    endpoint = args.dynamodb_endpoint or env.get("LEASEGUARD_DYNAMODB_ENDPOINT") or None
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    # Kept for the one-line explanation of a failure (leaseguard.cli.backends.explain).
    args.backend_config = ProviderConfig(
        backend="dynamodb", table_name=name, dynamodb_endpoint=endpoint, region_name=region
    )
    try:
        provider = DynamoDBLeaseProvider(name, endpoint_url=endpoint, region_name=region)
    except InvalidLeaseArgument as exc:
        raise ConfigurationError(f"--table: {exc}") from exc
    created = provider.create_table(wait=not args.no_wait)
    where = endpoint or f"region {region or 'default'}"
    if created:
        pending = " (creating: --no-wait)" if args.no_wait else ""
        print(f"created DynamoDB table {quote(name)} at {escape(where)}{pending}")
    else:
        print(f"DynamoDB table {quote(name)} exists at {escape(where)}: indexes and TTL checked")
    return 0
