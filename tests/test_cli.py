"""The ``leaseguard`` command: simulate, inspect, sweep, invoke."""

from __future__ import annotations

import json
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
