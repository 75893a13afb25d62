"""The ``leaseguard`` command: simulate, inspect, sweep, invoke."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from leaseguard import RedisLeaseProvider, Signal, lease_owned
from leaseguard.cli import main
from leaseguard.config import ProviderConfig
from leaseguard.testing import LambdaContext

from .test_simulate import Reorders


def run_cli(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--workers", "0"], "--workers must be at least 1"),
        (["simulate", "--work-ms", "40-5"], "--work-ms must be MIN-MAX"),
        (["simulate", "--work-ms", "fast"], "--work-ms must look like 5-40"),
        (["simulate", "--kill-rate", "1.5"], "kill_rate must be in [0, 1)"),
        (["simulate", "--memory", "--kill-rate", "0.1"], "needs worker processes"),
        (["simulate", "--plot", "out.jpg"], "--plot must name a .png"),
        (["simulate", "--memory", "--dynamodb"], "not allowed with argument"),
        (["simulate", "--redis-cluster"], "--redis-cluster needs --redis-url"),
        (["simulate", "--invocations", "many"], "invalid int value"),
        (["simulate", "--drain-batch", "-1"], "drain_batch must be in [0, 1000]"),
        (["invoke", "nocolon", "--event", "x.json"], "cannot read the event"),
        (["sweep"], "one of the arguments --function --queue-url --print is required"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_argument_errors_are_clear(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(*argv) == 2
    assert message in capsys.readouterr().err


def test_simulate_writes_plot_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot, raw = tmp_path / "timeline.png", tmp_path / "run.json"
    code = run_cli(
        "simulate",
        "--memory",
        "--invocations",
        "60",
        "--keys",
        "2",
        "--quiet",
        "--plot",
        str(plot),
        "--json",
        str(raw),
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verified" in out and "invocations" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    data = json.loads(raw.read_text())
    assert data["verified"] is True and data["violations"] == []
    assert data["summary"]["invocations"] == 60 and data["summary"]["handled"] == 60


def test_simulate_on_the_embedded_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("simulate", "--invocations", "40", "--quiet") == 0
    out = capsys.readouterr().out
    assert "embedded Redis" in out and "verified" in out


def test_simulate_with_a_drain_batch_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(
        "simulate", "--memory", "--invocations", "80", "--keys", "1", "--drain-batch", "5",
        "--quiet",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "verified" in out, out


def test_simulate_exits_1_and_reports_violations(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(ProviderConfig, "build", lambda self: Reorders())
    code = run_cli("simulate", "--memory", "--invocations", "150", "--keys", "2", "--quiet")
    out = capsys.readouterr().out
    assert code == 1
    assert "violation" in out and "fifo" in out


def test_inspect_shows_holder_token_ttl_and_queue(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"cli{uuid.uuid4().hex[:6]}:"
    provider = RedisLeaseProvider.from_url(redis_url, prefix=prefix)
    held = provider.acquire_lease("thread:7", "owner-1", 30_000)
    provider.acquire_or_enqueue("thread:7", Signal("sig-a", {"text": "hello"}), 30_000)
    assert (
        run_cli("inspect", "thread:7", "--redis-url", redis_url, "--prefix", prefix, "--json") == 0
    )
    info = json.loads(capsys.readouterr().out)
    assert (info["owner"], info["token"]) == ("owner-1", held.token)
    assert 0 < info["remaining_ms"] <= 30_000
    assert [q["id"] for q in info["queued"]] == ["sig-a"]
    assert (
        info["queued"][0]["bytes"] == len('{"text":"hello"}') and info["queued"][0]["age_ms"] >= 0
    )
    assert (
        run_cli("inspect", "thread:7", "free-key", "--redis-url", redis_url, "--prefix", prefix)
        == 0
    )
    text = capsys.readouterr().out
    assert "owner-1" in text and "sig-a" in text and "(free)" in text


def test_sweep_adopts_and_prints_envelopes_that_complete_the_work(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"cli{uuid.uuid4().hex[:6]}:"
    provider = RedisLeaseProvider.from_url(redis_url, prefix=prefix)
    provider.acquire_lease("k", "dead-owner", 100)
    provider.acquire_or_enqueue("k", Signal("stranded", {"k": "k", "n": 1}), 30_000)
    import time

    time.sleep(0.25)
    assert run_cli("sweep", "--print", "--redis-url", redis_url, "--prefix", prefix) == 0
    envelopes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(envelopes) == 1
    ran: list[Any] = []

    @lease_owned(lambda e: e["k"], provider=provider)
    def handler(event: dict[str, Any], context: Any) -> None:
        ran.append(event)

    handler(envelopes[0], LambdaContext())
    assert ran == [{"k": "k", "n": 1}]
    assert provider.inspect_key("k").owner is None


HANDLER_MODULE = """
from leaseguard import current_lease, lease_owned

@lease_owned("pathParameters.threadId")
def handler(event, context):
    lease = current_lease()
    alive = context.get_remaining_time_in_millis() > 0
    return {"statusCode": 200, "body": f"{lease.key} by {lease.owner} until {alive}"}

def broken(event, context):
    raise RuntimeError("boom")
"""


def test_invoke_runs_a_handler_with_a_lambda_context(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(HANDLER_MODULE)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pathParameters": {"threadId": "t-1"}}))
    env = {"LEASEGUARD_BACKEND": "memory", "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "leaseguard", "invoke"]
    done = subprocess.run(
        [*cmd, f"{tmp_path}/app.py:handler", "--event", str(event), "--request-id", "req-9"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"statusCode": 200, "body": "t-1 by req-9 until True"}
    failed = subprocess.run(
        [*cmd, f"{tmp_path}/app.py:broken", "--event", str(event)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert failed.returncode == 1 and "RuntimeError: boom" in failed.stderr
    missing = subprocess.run(
        [*cmd, f"{tmp_path}/app.py:nothing", "--event", str(event)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert missing.returncode == 2 and "no callable 'nothing'" in missing.stderr


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "leaseguard", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith("leaseguard ")


def test_simulate_with_kills_on_the_embedded_default(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(
        "simulate",
        "--invocations",
        "60",
        "--keys",
        "2",
        "--kill-rate",
        "0.1",
        "--ttl-ms",
        "400",
        "--quiet",
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "workers killed" in out and "verified" in out


# -- dead letters: inspect, dead-letters, redrive ------------------------------------------------


def _backend(backend: str, request: pytest.FixtureRequest) -> tuple[Any, list[str]]:
    """A provider and the CLI arguments that reach the same keys. "memory" hands the CLI the
    test's own in-memory provider (it has no cross-process store of its own)."""
    if backend == "memory":
        from leaseguard.providers.memory import InMemoryLeaseProvider

        provider = InMemoryLeaseProvider()
        request.getfixturevalue("monkeypatch").setattr(
            ProviderConfig, "build", lambda self: provider
        )
        return provider, ["--redis-url", "redis://in-memory.invalid:1"]
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = f"cli{uuid.uuid4().hex[:6]}:"
        return RedisLeaseProvider.from_url(url, prefix=prefix), [
            "--redis-url",
            url,
            "--prefix",
            prefix,
        ]
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

    if DynamoDBLeaseProvider.__abstractmethods__:
        pytest.skip("the DynamoDB provider does not implement dead letters yet")
    endpoint = request.getfixturevalue("dynamodb_endpoint")
    table = request.getfixturevalue("dynamodb_table")
    provider = DynamoDBLeaseProvider(table, endpoint_url=endpoint, region_name="us-east-1")
    return provider, ["--dynamodb-endpoint", endpoint, "--table", table]


def _poison(provider: Any, key: str, signal_id: str, payload: Any, *, halt: bool) -> None:
    """Run ``signal_id`` on ``key`` and fail it once with max_attempts=1: a dead letter."""
    result = provider.acquire_or_enqueue(key, Signal(signal_id, payload), 30_000)
    assert result.acquired
    provider.transfer_to_next(
        key,
        signal_id,
        30_000,
        token=result.token,
        error="RuntimeError: boom\n  at line 3",
        max_attempts=1,
        on_poison="halt" if halt else "skip",
    )


DEAD_LETTER_BACKENDS = ["memory", "redis", "dynamodb"]


@pytest.mark.parametrize("backend", DEAD_LETTER_BACKENDS)
def test_inspect_shows_dead_letters_and_halted(
    backend: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    provider, where = _backend(backend, request)
    big = {"text": "x" * 500}
    _poison(provider, "thread:9", "sig-dead", big, halt=True)
    provider.acquire_or_enqueue("thread:9", Signal("sig-next", {"n": 2}), 30_000)
    assert run_cli("inspect", "thread:9", *where, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["halted"] is True
    [dead] = info["dead_letters"]
    assert (dead["id"], dead["attempts"], dead["payload"]) == ("sig-dead", 1, big)
    assert dead["error"].startswith("RuntimeError: boom")
    assert 0 < dead["enqueued_at_ms"] <= dead["failed_at_ms"]
    assert [q["id"] for q in info["queued"]] == ["sig-next"]

    assert run_cli("inspect", "thread:9", *where) == 0
    text = capsys.readouterr().out
    assert "halted     yes" in text and "leaseguard redrive thread:9" in text
    assert "dead       1" in text and "sig-dead  attempts 1" in text
    assert "error    RuntimeError: boom at line 3" in text  # one line
    assert re.search(r"failed   \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+ s ago\)", text)
    preview = next(line for line in text.splitlines() if "payload" in line)
    assert '{"text":"xxx' in preview and "..." in preview and len(preview) < 140
    assert f"({len(json.dumps(big, separators=(',', ':')))} bytes)" in preview


@pytest.mark.parametrize("backend", DEAD_LETTER_BACKENDS)
def test_dead_letters_lists_keys_with_counts_and_redrive_puts_them_back(
    backend: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    provider, where = _backend(backend, request)
    assert run_cli("dead-letters", *where) == 0
    assert capsys.readouterr().out == "no key holds dead letters\n"
    _poison(provider, "a", "a-1", {"n": 1}, halt=True)
    _poison(provider, "b", "b-1", {"n": 1}, halt=False)
    _poison(provider, "b", "b-2", {"n": 2}, halt=False)

    assert run_cli("dead-letters", *where) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["dead", "halted", "key"]
    assert [line.split() for line in lines[1:]] == [["1", "yes", "a"], ["2", "b"]]
    assert run_cli("dead-letters", "--limit", "1", *where, "--json") == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row in (
        {"key": "a", "dead_letters": 1, "halted": True},
        {"key": "b", "dead_letters": 2, "halted": False},
    )

    # one by id, then the rest; a repeat has nothing left to move
    assert run_cli("redrive", "b", "--id", "b-2", "--id", "nope", *where) == 0
    out = capsys.readouterr().out
    assert "redrove 1 dead letter(s) of 'b'" in out and "not dead letters of 'b': 'nope'" in out
    assert [d.id for d in provider.inspect_key("b").dead_letters] == ["b-1"]
    assert [s.id for s in provider.inspect_key("b").queued] == ["b-2"]
    assert run_cli("redrive", "a", *where) == 0
    assert "redrove 1 dead letter(s) of 'a'" in capsys.readouterr().out
    state = provider.inspect_key("a")
    assert not state.halted and not state.dead_letters and [s.id for s in state.queued] == ["a-1"]
    assert run_cli("redrive", "a", *where) == 0
    assert capsys.readouterr().out == "nothing to redrive: 'a' holds no dead letters\n"
    assert run_cli("redrive", "b", "--id", "zzz", *where) == 0
    assert "nothing to redrive: 'b' holds no dead letter with id 'zzz'" in capsys.readouterr().out
    assert run_cli("dead-letters", *where, "--json") == 0
    assert json.loads(capsys.readouterr().out) == [{"key": "b", "dead_letters": 1, "halted": False}]


def test_dead_letters_says_when_the_limit_cut_the_list(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    provider, where = _backend("memory", request)
    for key in ("a", "b", "c"):
        _poison(provider, key, f"{key}-1", {}, halt=False)
    assert run_cli("dead-letters", "--limit", "2", *where) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 4 and "--limit N shows more" in out


@pytest.mark.parametrize(
    "command",
    ["simulate", "inspect", "dead-letters", "redrive", "sweep", "invoke", None],
)
def test_help_is_plain_text(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(*([command] if command else []), "--help") == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out and ":meth:" not in out
    assert "usage: leaseguard" in out
