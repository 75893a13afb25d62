"""The guard's answers carry stable status words: the table in docs/design.md ("Statuses") is
``leaseguard.Status``, the guard emits every one of them and no other, and the failure fates
(``retried``, ``dead_lettered``, ``halted``) are what a hand-off receiver answers on every
backend."""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path
from typing import Any

import pytest

import leaseguard.guard
from leaseguard import HandoffConfig, RetryConfig, current_lease, lease_owned
from leaseguard.guard import Status
from leaseguard.testing import LambdaContext

from .conftest import ProviderFactory
from .handoffs import RecordingLambda

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
GUARD = ROOT / "leaseguard" / "guard"
TTL = 5_000


def documented() -> list[str]:
    section = DESIGN.read_text().split("\n## Statuses\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE)


def emitted() -> set[str]:
    """Every ``Status.X`` the guard's code names outside the class itself."""
    names: set[str] = set()
    for path in GUARD.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "Status"
            ):
                names.add(node.attr)
    return {Status[name].value for name in names}


def test_the_documented_statuses_are_the_enum_and_what_the_guard_emits() -> None:
    words = documented()
    assert len(words) == len(set(words))
    assert set(words) == {status.value for status in Status}
    assert emitted() == set(words)
    for word in words:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", word), word  # one token, snake_case
    assert "Status" in leaseguard.guard.__all__


def test_no_status_is_spelt_as_a_literal_in_the_guard() -> None:
    """A status written as a string somewhere would escape the list."""
    for path in GUARD.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"""["']status["']\s*:\s*["']""", text), path.name
        assert not re.search(r"""status\s*=\s*["']""", text), path.name


def _poison_chain(
    make_provider: ProviderFactory, backend: str, *, max_attempts: int, dead_limit: int
) -> list[str]:
    """An owner holds key ``k`` while two poison events are forwarded; it hands off by Invoke
    after its run, and every hand-off is delivered: the receivers' answers, in order."""
    provider = make_provider(backend)(dead_limit=dead_limit)
    client = RecordingLambda()
    gate, inside = threading.Event(), threading.Event()

    @lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig("invoke", lambda_client=client),
        retries=RetryConfig(max_attempts=max_attempts),
    )
    def handler(event: dict[str, Any], context: Any) -> str:
        current_lease()
        if event["n"] == "owner":
            inside.set()
            assert gate.wait(10)
            return "ok"
        raise ValueError(f"poison {event['n']}")

    owner = threading.Thread(target=handler, args=({"k": "k", "n": "owner"}, LambdaContext()))
    owner.start()
    assert inside.wait(10)
    for poison in ("a", "b"):
        assert handler({"k": "k", "n": poison}, LambdaContext())["leaseguard"]["status"] == (
            "forwarded"
        )
    gate.set()
    owner.join(10)
    return [answer["leaseguard"]["status"] for answer in client.deliver(handler)]


def test_a_failed_hand_off_run_says_retried_then_dead_lettered(
    make_provider: ProviderFactory, lease_backend: str
) -> None:
    answers = _poison_chain(make_provider, lease_backend, max_attempts=2, dead_limit=10)
    assert answers == ["retried", "dead_lettered", "retried", "dead_lettered"]


def test_a_failed_last_attempt_kept_on_a_full_dead_letter_list_says_halted(
    make_provider: ProviderFactory, lease_backend: str
) -> None:
    answers = _poison_chain(make_provider, lease_backend, max_attempts=1, dead_limit=1)
    assert answers == ["dead_lettered", "halted"]


@pytest.mark.parametrize("status", list(Status))
def test_a_status_is_its_word(status: Status) -> None:
    assert status == status.value and str(status) == status.value


def test_a_redelivery_of_an_event_that_succeeded_says_duplicate(
    make_provider: ProviderFactory, lease_backend: str
) -> None:
    provider = make_provider(lease_backend)()
    ran: list[int] = []
    handler = lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL)(
        lambda event, context: ran.append(1) or "done"
    )
    context = LambdaContext()  # a redelivery has the same request id
    assert handler({"k": "d"}, context) == "done"
    assert handler({"k": "d"}, context)["leaseguard"]["status"] == "duplicate" and ran == [1]
