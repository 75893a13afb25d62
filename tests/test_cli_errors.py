"""Every failure of the leaseguard command is one line on stderr that says what failed and what
to do; exit status 2 for usage and configuration errors, 1 for a backend failure. Most cases
run the real command in a child process, with a scrubbed environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from typing import Any

import boto3
import pytest

from leaseguard import RedisLeaseProvider, Signal
from leaseguard.cli import main
from leaseguard.config import ProviderConfig
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.testing.servers import free_port

NO_AWS = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def leaseguard(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m leaseguard ARGV`` with no LEASEGUARD_* or AWS_* variables but ``env``."""
    clean = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("LEASEGUARD_", "AWS_"))
    }
    return subprocess.run(
        [sys.executable, "-m", "leaseguard", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **NO_AWS, **(env or {})},
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str], code: int, command: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"leaseguard {command}: error: "), lines[0]
    assert "Traceback" not in done.stderr
    return lines[0]


def unreachable_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}"


def needs_dynamodb_dead_letters() -> None:
    if DynamoDBLeaseProvider.__abstractmethods__:
        pytest.skip("the DynamoDB provider is not complete yet (dead letters)")


# (a), (b): a Redis that is not there ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "k"],
        ["sweep", "--print"],
        ["dead-letters"],
        ["redrive", "k"],
        ["inspect", "k", "--redis-cluster"],
    ],
    ids=["inspect", "sweep", "dead-letters", "redrive", "inspect-cluster"],
)
def test_unreachable_redis_is_one_line_exit_1(argv: list[str]) -> None:
    url = unreachable_redis()
    line = one_line(leaseguard(*argv, "--redis-url", url), 1, argv[0])
    assert f"cannot reach Redis at {url}" in line and "Connection refused" in line
    assert "--redis-url (or LEASEGUARD_REDIS_URL)" in line


def test_unreachable_redis_from_the_environment_too() -> None:
    url = unreachable_redis()
    line = one_line(leaseguard("inspect", "k", env={"LEASEGUARD_REDIS_URL": url}), 1, "inspect")
    assert f"cannot reach Redis at {url}" in line


def test_redis_password_is_not_printed() -> None:
    port = free_port()
    line = one_line(
        leaseguard("inspect", "k", "--redis-url", f"redis://app:s3cret@127.0.0.1:{port}"),
        1,
        "inspect",
    )
    assert "s3cret" not in line and f"redis://***@127.0.0.1:{port}" in line


# (c): simulate fails fast ----------------------------------------------------------------------


def test_simulate_against_unreachable_redis_fails_fast() -> None:
    url = unreachable_redis()
    started = time.monotonic()
    done = leaseguard("simulate", "--redis-url", url, "--quiet")
    elapsed = time.monotonic() - started
    line = one_line(done, 1, "simulate")
    assert f"cannot reach Redis at {url}" in line
    assert elapsed < 10, elapsed
    assert done.stdout == ""  # no run was started


# (d): a bad URL -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["--redis-url", "notaurl://x"],
            {},
            "--redis-url must start with redis://, rediss:// or unix://, got 'notaurl://x'",
        ),
        (
            [],
            {"LEASEGUARD_REDIS_URL": "localhost:6379"},
            "LEASEGUARD_REDIS_URL must start with redis://",
        ),
        (["--redis-url", "redis://host:notaport"], {}, "invalid backend setting: Port"),
    ],
    ids=["flag", "environment", "port"],
)
def test_a_bad_redis_url_is_a_configuration_error(
    argv: list[str], env: dict[str, str], expected: str
) -> None:
    commands = [["inspect", "k"]] + ([["simulate", "--quiet"]] if argv else [])  # env: not simulate
    for command in commands:
        line = one_line(leaseguard(*command, *argv, env=env), 2, command[0])
        assert expected in line


# (e): a missing DynamoDB table is named, never created -------------------------------------------


def _tables(endpoint: str) -> list[str]:
    client = boto3.client("dynamodb", endpoint_url=endpoint, **_boto_args())
    return list(client.list_tables()["TableNames"])


def _boto_args() -> dict[str, Any]:
    return {
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }


@pytest.mark.parametrize(
    "argv", [["inspect", "k"], ["sweep", "--print"], ["dead-letters"], ["redrive", "k"]]
)
def test_a_missing_table_is_named_and_not_created(dynamodb_endpoint: str, argv: list[str]) -> None:
    needs_dynamodb_dead_letters()
    table = f"typo-{uuid.uuid4().hex[:8]}"
    done = leaseguard(
        *argv, "--dynamodb-endpoint", dynamodb_endpoint, "--table", table, env=FAKE_AWS
    )
    line = one_line(done, 2, argv[0])
    assert f"DynamoDB table {table!r} does not exist at {dynamodb_endpoint}" in line
    assert "--table or LEASEGUARD_TABLE_NAME" in line
    assert table not in _tables(dynamodb_endpoint)


def test_simulate_creates_a_table_only_when_asked(dynamodb_endpoint: str) -> None:
    needs_dynamodb_dead_letters()
    table = f"typo-{uuid.uuid4().hex[:8]}"
    where = ["--dynamodb-endpoint", dynamodb_endpoint]
    line = one_line(leaseguard("simulate", *where, "--table", table, env=FAKE_AWS), 2, "simulate")
    assert f"DynamoDB table {table!r} does not exist" in line and "--create-table" in line
    line = one_line(leaseguard("simulate", *where, env=FAKE_AWS), 2, "simulate")
    assert "needs --table NAME (an existing table), or --create-table" in line
    assert table not in _tables(dynamodb_endpoint)
    done = leaseguard(
        "simulate", *where, "--table", table, "--create-table", "--quiet", "--invocations", "10",
        "--keys", "2", "--workers", "2", env=FAKE_AWS,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified" in done.stdout and table in _tables(dynamodb_endpoint)


def test_create_table_needs_an_endpoint() -> None:
    line = one_line(leaseguard("simulate", "--create-table"), 2, "simulate")
    assert "--create-table needs --dynamodb-endpoint" in line


def test_dynamodb_without_credentials(dynamodb_endpoint: str, dynamodb_table: str) -> None:
    needs_dynamodb_dead_letters()
    where = ["--dynamodb-endpoint", dynamodb_endpoint, "--table", dynamodb_table]
    line = one_line(leaseguard("inspect", "k", *where), 2, "inspect")
    assert "no AWS credentials found" in line and "AWS_PROFILE" in line


# (f): sweep --function without AWS credentials ---------------------------------------------------


def test_sweep_to_a_function_without_credentials_adopts_nothing(redis_url: str) -> None:
    prefix = f"clierr{uuid.uuid4().hex[:6]}:"
    provider = RedisLeaseProvider.from_url(redis_url, prefix=prefix)
    provider.acquire_lease("k", "dead-owner", 100)
    provider.acquire_or_enqueue("k", Signal("stranded", {"n": 1}), 30_000)
    time.sleep(0.25)
    where = ["--redis-url", redis_url, "--prefix", prefix]
    line = one_line(leaseguard("sweep", "--function", "my-fn", *where), 2, "sweep")
    assert line == (
        "leaseguard sweep: error: no AWS credentials found for invoking my-fn: set "
        "AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    )
    line = one_line(leaseguard("sweep", "--queue-url", "https://sqs.example/q", *where), 2, "sweep")
    assert "no AWS credentials found for sending to https://sqs.example/q" in line
    no_region = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    line = one_line(leaseguard("sweep", "--function", "f", *where, env=no_region), 2, "sweep")
    assert "no AWS region configured for invoking f: set AWS_REGION" in line
    state = provider.inspect_key("k")  # still orphaned: nothing was adopted and then lost
    assert state.owner is None and [s.id for s in state.queued] == ["stranded"]


def test_sweep_reports_each_failed_dispatch_and_exits_1(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from leaseguard.cli import sweep_cmd

    class Refusing:
        def invoke(self, **params: Any) -> None:
            raise RuntimeError("AccessDenied")

    monkeypatch.setattr(sweep_cmd, "aws_client", lambda service, purpose: Refusing())
    prefix = f"clierr{uuid.uuid4().hex[:6]}:"
    provider = RedisLeaseProvider.from_url(redis_url, prefix=prefix)
    provider.acquire_lease("k", "dead-owner", 100)
    provider.acquire_or_enqueue("k", Signal("stranded", {"n": 1}), 30_000)
    time.sleep(0.25)
    code = main(["sweep", "--function", "fn", "--redis-url", redis_url, "--prefix", prefix])
    captured = capsys.readouterr()
    assert code == 1
    [line] = captured.err.splitlines()
    assert line.startswith("leaseguard sweep: error: could not dispatch signal 'stranded' of key")
    assert "async invoke of fn failed: AccessDenied" in line and "adopts it again" in line
    assert captured.out == "adopted and dispatched 0 signal(s), 1 failed\n"


# no backend configured: fail closed ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["inspect", "k"], ["sweep", "--print"], ["redrive", "k"], ["dead-letters"]]
)
@pytest.mark.parametrize("backend", ["", "noop", "memory"])
def test_no_backend_configured_fails_closed(argv: list[str], backend: str) -> None:
    env = {"LEASEGUARD_BACKEND": backend} if backend else {}
    line = one_line(leaseguard(*argv, env=env), 2, argv[0])
    assert "--redis-url" in line and "--dynamodb-endpoint" in line
    assert "LEASEGUARD_REDIS_URL" in line and "LEASEGUARD_TABLE_NAME" in line
    assert ("no backend configured" if not backend else f"LEASEGUARD_BACKEND={backend}") in line


def test_half_configured_backend_names_the_missing_variable() -> None:
    line = one_line(leaseguard("inspect", "k", env={"LEASEGUARD_BACKEND": "redis"}), 2, "inspect")
    assert "the redis backend needs LEASEGUARD_REDIS_URL" in line


# usage errors, unexpected errors, LEASEGUARD_DEBUG ---------------------------------------------


@pytest.mark.parametrize(
    ("argv", "command", "expected"),
    [
        (["inspect"], "inspect", "the following arguments are required: key"),
        (["dead-letters", "--limit", "0"], "dead-letters", "--limit must be positive"),
        (["redrive", "k", "--id", ""], "redrive", "--id must not be empty"),
        (["sweep", "--print", "--ttl-ms", "0"], "sweep", "--limit and --ttl-ms must be positive"),
        (["simulate", "--workers", "0"], "simulate", "--workers must be at least 1"),
    ],
)
def test_usage_errors_are_one_line_exit_2(argv: list[str], command: str, expected: str) -> None:
    line = one_line(leaseguard(*argv), 2, command)
    assert expected in line and line.endswith(f"(see leaseguard {command} --help)")


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(self: ProviderConfig) -> Any:
        raise TypeError("something\nbroke")

    monkeypatch.setattr(ProviderConfig, "build", broken)
    argv = ["inspect", "k", "--redis-url", "redis://127.0.0.1:1"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "leaseguard inspect: error: unexpected TypeError: something broke "
        "(LEASEGUARD_DEBUG=1 shows the traceback)\n"
    )
    monkeypatch.setenv("LEASEGUARD_DEBUG", "1")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "TypeError: something" in err
    assert err.splitlines()[-1].startswith("leaseguard inspect: error: unexpected TypeError")


def test_create_table_creates_once_and_then_checks(dynamodb_endpoint: str) -> None:
    """leaseguard create-table: the table with both indexes and TTL; run again, it finds it;
    a table of that name without the indexes, or a bad name, is a one-line error (exit 2)."""
    table = f"lg-{uuid.uuid4().hex[:8]}"
    where = ["--dynamodb-endpoint", dynamodb_endpoint]
    done = leaseguard("create-table", *where, "--table", table, env=FAKE_AWS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"created DynamoDB table {table!r} at {dynamodb_endpoint}"
    client = boto3.client("dynamodb", endpoint_url=dynamodb_endpoint, **_boto_args())
    described = client.describe_table(TableName=table)["Table"]
    indexes = {index["IndexName"] for index in described["GlobalSecondaryIndexes"]}
    assert indexes == {"orphans", "dead_letters"}
    ttl = client.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "ttl")
    # the provider works on it
    provider = DynamoDBLeaseProvider(table, client=client)
    assert provider.acquire_or_enqueue("k", Signal("s1", {}), 5_000).acquired

    again = leaseguard("create-table", *where, env={**FAKE_AWS, "LEASEGUARD_TABLE_NAME": table})
    assert again.returncode == 0, again.stdout + again.stderr
    assert "exists" in again.stdout and "indexes and TTL checked" in again.stdout

    bare = f"bare-{uuid.uuid4().hex[:8]}"
    client.create_table(
        TableName=bare,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
    )
    line = one_line(
        leaseguard("create-table", *where, "--table", bare, env=FAKE_AWS), 2, "create-table"
    )
    assert f"table {bare!r} exists without the 'orphans' index" in line
    line = one_line(
        leaseguard("create-table", *where, "--table", "x", env=FAKE_AWS), 2, "create-table"
    )
    assert "--table" in line and "3 to 255 characters" in line
