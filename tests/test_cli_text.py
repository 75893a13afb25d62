"""What the ``leaseguard`` commands print of text they did not write (issue 23, finding 6): a key,
a signal id, an owner, an error text or an exception's message with a newline, a carriage
return, an ANSI escape, other C0/C1 controls or non-printing unicode (U+202E) cannot forge a
row or reach the terminal, on every backend; ``--json`` keeps the exact value. And a redrive
whose reply was lost and which redis-py resent reports what it moved.
"""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from leaseguard import Signal
from leaseguard.cli import one_line
from leaseguard.cli.text import escape, json_line, quote, shell_word, word
from leaseguard.handoff import ENVELOPE_FIELD
from leaseguard.providers import redis as lg_redis
from leaseguard.simulate.checker import Violation

from .conftest import let_leases_expire
from .faults import Drop, FaultPlan, ReplyDroppingProxy, evalsha_of
from .test_cli import DEAD_LETTER_BACKENDS, _backend, run_cli

# Every kind of character a terminal or a reader of rows may act on.
HOSTILE = "\n\r\x1b[31m\x07\x00\t\x7f\x85\x9b\u202e\u2028\u200b\xa0\udc80\\'\""
KEY = f"k{HOSTILE}forged 9 yes"
SIGNAL_ID = f"s{HOSTILE}id"
ERROR = f"Boom{HOSTILE}at line 3"
PAYLOAD = {"text": f"p{HOSTILE}q", "ü": "ok"}


def no_control(text: str) -> None:
    """Only printable characters, and the newlines between the lines the command wrote."""
    bad = sorted({char for char in text if char != "\n" and not char.isprintable()})
    assert not bad, f"raw control characters reached the output: {bad!r}"


def storable(value: str) -> str:
    """``value`` without its lone surrogate: keys, ids and payloads must be UTF-8 (the
    validation refuses one), so it stays in the helper's own tests."""
    return value.replace("\udc80", "")


def dead_letter(provider: Any, key: str, sid: str, *, halt: bool = True) -> None:
    held = provider.acquire_or_enqueue(key, Signal(sid, PAYLOAD), 30_000)
    assert held.acquired
    provider.transfer_to_next(
        key,
        sid,
        30_000,
        token=held.token,
        error=ERROR,
        max_attempts=1,
        on_poison="halt" if halt else "skip",
    )


# -- the helper -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [HOSTILE, KEY, "\udc80", "\U000e0001", "plain", "", " edge "])
def test_the_helper_escapes_every_non_printable_character_and_reads_back(value: str) -> None:
    for shown in (escape(value), quote(value), word(value), json_line(value), one_line(value)):
        no_control(shown.replace("\n", "\\n"))
        assert "\n" not in shown
        shown.encode("utf-8")  # printable: no lone surrogate left to crash a UTF-8 stdout
    assert ast.literal_eval(quote(value)) == value
    assert json.loads(json_line(value)) == value
    assert json.loads(json_line({"p": [value, PAYLOAD]})) == {"p": [value, PAYLOAD]}
    plain = word(value)
    assert plain == value if plain[:1] != "'" else ast.literal_eval(plain) == value
    # a word is bare only when it is exactly the value: no quote, escape or edge space
    assert word("thread:9") == "thread:9" and word("a b") == "a b"
    assert word("'x'") == "'\\'x\\''" and word(" x") == "' x'" and word("") == "''"


def test_shell_words_read_back_in_bash(tmp_path: Path) -> None:
    import subprocess

    for value in (KEY.replace("\x00", "").replace("\udc80", ""), "plain key", "it's"):
        script = tmp_path / "echo.sh"
        script.write_text(f"printf '%s' {shell_word(value)}\n", encoding="utf-8")
        done = subprocess.run(
            ["bash", str(script)],
            capture_output=True,
            check=True,
            timeout=10,
            env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"},
        )
        assert done.stdout.decode("utf-8") == value
        no_control(shell_word(value))


def test_one_line_keeps_messages_on_one_line_and_escaped() -> None:
    line = one_line(f"cannot reach {KEY!s}: {ERROR}")
    no_control(line)
    assert "\n" not in line and "\x1b" not in line and "\\x1b[31m" in line


# -- each command, on each backend ----------------------------------------------------------------


@pytest.mark.parametrize("backend", DEAD_LETTER_BACKENDS)
def test_dead_letters_cannot_be_forged_by_a_key(
    backend: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    provider, where = _backend(backend, request)
    key = storable(KEY)
    dead_letter(provider, key, "a")
    dead_letter(provider, "plain", "b", halt=False)
    assert run_cli("dead-letters", *where) == 0
    captured = capsys.readouterr()
    no_control(captured.out + captured.err)
    lines = captured.out.splitlines()
    assert len(lines) == 3, lines  # the header and one row per key: no forged row
    assert lines[1].split()[:2] == ["1", "yes"]
    shown = lines[1].split(None, 2)[2]
    assert ast.literal_eval(shown) == key  # quoted and escaped: the exact key
    assert lines[2].split() == ["1", "plain"]
    assert run_cli("dead-letters", *where, "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["key"] for row in rows} == {key, "plain"}


@pytest.mark.parametrize("backend", DEAD_LETTER_BACKENDS)
def test_inspect_escapes_keys_ids_owners_errors_and_payloads(
    backend: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    provider, where = _backend(backend, request)
    key, sid = storable(KEY), storable(SIGNAL_ID)
    dead_letter(provider, key, sid)
    owner = storable(f"o{HOSTILE}")
    provider.acquire_lease(key, owner, 30_000)
    provider.acquire_or_enqueue(key, Signal(f"q{sid}", {}), 30_000)
    provider.take_signals(key, owner, 1)
    provider.acquire_or_enqueue(key, Signal(f"r{sid}", {}), 30_000)
    assert run_cli("inspect", key, *where) == 0
    captured = capsys.readouterr()
    no_control(captured.out + captured.err)
    lines = captured.out.splitlines()
    labels = [line.split(None, 1)[0] for line in lines if not line.startswith(" ")]
    assert labels == ["key", "holder", "token", "ttl", "halted", "queued", "in", "dead"]
    assert ast.literal_eval(lines[0].split(None, 1)[1]) == key
    assert ast.literal_eval(lines[1].split(None, 1)[1]) == owner
    error = next(line for line in lines if line.strip().startswith("error"))
    assert "\\x1b[31m" in error and "\\u202e" in error
    payload = next(line for line in lines if line.strip().startswith("payload"))
    preview = payload.split(None, 1)[1]
    assert preview.startswith('{"text":"p\\n\\r\\u001b[31m\\u0007\\u0000\\t\\u007f\\u0085')
    assert run_cli("inspect", key, *where, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["key"], info["owner"], info["in_flight"]) == (key, owner, [f"q{sid}"])
    assert [q["id"] for q in info["queued"]] == [f"r{sid}"]
    [dead] = info["dead_letters"]
    assert (dead["id"], dead["payload"]) == (sid, PAYLOAD) and dead["error"].startswith("Boom")


@pytest.mark.parametrize("backend", DEAD_LETTER_BACKENDS)
def test_redrive_escapes_the_key_and_the_ids(
    backend: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    provider, where = _backend(backend, request)
    key, sid = storable(KEY), storable(SIGNAL_ID)
    dead_letter(provider, key, sid)
    missing = storable(f"m{HOSTILE}")
    assert run_cli("redrive", key, "--id", sid, "--id", missing, *where) == 0
    captured = capsys.readouterr()
    no_control(captured.out + captured.err)
    lines = captured.out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("redrove 1 dead letter(s) of '")
    assert ast.literal_eval(lines[1].rsplit(": ", 1)[1]) == missing
    assert run_cli("redrive", key, *where) == 0
    out = capsys.readouterr().out
    no_control(out)
    assert out.startswith("nothing to redrive: '") and out.count("\n") == 1


def test_sweep_prints_envelopes_as_exact_json(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    provider, where = _backend("redis", request)
    key, sid = storable(KEY), storable(SIGNAL_ID)
    provider.acquire_lease(key, "dead", 30_000)
    provider.acquire_or_enqueue(key, Signal(sid, PAYLOAD), 30_000)
    let_leases_expire(provider, (key, "dead"))
    assert run_cli("sweep", "--print", *where) == 0
    captured = capsys.readouterr()
    no_control(captured.out + captured.err)
    events = [json.loads(line) for line in captured.out.splitlines()]
    mine = [e[ENVELOPE_FIELD] for e in events if e[ENVELOPE_FIELD]["key"] == key]
    assert len(mine) == 1 and (mine[0]["owner"], mine[0]["payload"]) == (sid, PAYLOAD)


def test_invoke_escapes_the_handlers_error_and_keeps_its_result_exact(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "app.py").write_text(
        "def broken(event, context):\n"
        f"    raise RuntimeError({ERROR!r})\n"
        "def echo(event, context):\n"
        "    return {'got': event['v']}\n"
    )
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"v": storable(HOSTILE)}))
    env = {"LEASEGUARD_BACKEND": "memory", "PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8"}
    cmd = [sys.executable, "-m", "leaseguard", "invoke"]

    def invoke(spec: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cmd, spec, "--event", str(event)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )

    failed = invoke(f"{tmp_path}/app.py:broken")
    assert failed.returncode == 1
    no_control(failed.stdout + failed.stderr)
    assert "RuntimeError: Boom\\n\\r\\x1b[31m" in failed.stderr
    done = invoke(f"{tmp_path}/app.py:echo")
    assert done.returncode == 0, done.stderr
    no_control(done.stdout)
    assert json.loads(done.stdout) == {"got": storable(HOSTILE)}
    # an error text of the command itself (a path it could not find) is escaped too
    missing = invoke(f"{tmp_path}/evil\x1b[31m\u202e.py:handler")
    assert missing.returncode == 2 and "no such file" in missing.stderr
    no_control(missing.stderr)
    assert missing.stderr.count("\n") == 1 and "\\x1b[31m\\u202e" in missing.stderr


def test_simulate_escapes_violations_keys_and_details() -> None:
    from rich.console import Console

    from leaseguard.cli.simulate_cmd import _print_verdict

    class Report:
        ok = False

        def __init__(self) -> None:
            self.violations = [Violation("overlap", KEY, f"detail [bold]{ERROR}")]

        def by_kind(self) -> dict[str, int]:
            return {"overlap": 1}

    class Result:
        quiesced = False

        def __init__(self) -> None:
            self.stuck = {KEY: {"owner": SIGNAL_ID}}
            self.unfinished: list[str] = []

    out = io.StringIO()
    _print_verdict(Console(file=out, width=400, color_system=None), Report(), Result())
    text = out.getvalue()
    no_control(text)
    assert len(text.splitlines()) == 3  # did not settle, the count, one violation
    assert "detail [bold]Boom\\n" in text  # brackets kept as text, not markup


# -- a redrive whose reply was lost (finding 6a), through the CLI -------------------------------


def test_the_cli_reports_what_a_resent_redrive_moved(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """The redrive ran on Redis and the proxy dropped its reply; redis-py resent the same
    EVALSHA (the same nonce). The command says it moved the dead letter (it used to say
    "nothing to redrive: holds no dead letters" while the key had been redriven)."""
    provider, where = _backend("redis", request)
    dead_letter(provider, "lost-reply", "a")
    port = urlparse(request.getfixturevalue("redis_url")).port
    assert port is not None
    plan = FaultPlan()
    proxy = ReplyDroppingProxy(port, plan)
    drop = plan.arm(Drop(evalsha_of(lg_redis.REDRIVE_LUA.sha)))
    try:
        through = ["--redis-url", f"redis://127.0.0.1:{proxy.port}/0", *where[2:]]
        assert run_cli("redrive", "lost-reply", *through) == 0
    finally:
        proxy.close()
    assert drop.dropped == [1]  # the first run moved it; its reply never arrived
    out = capsys.readouterr().out
    assert out.startswith("redrove 1 dead letter(s) of 'lost-reply'"), out
    state = provider.inspect_key("lost-reply")
    assert [s.id for s in state.queued] == ["a"] and not state.halted
