"""Failed work is never silently dropped (issue 11), on every backend: a full queue refuses
visibly, a poison signal halts its key when asked to, a signal whose runs keep dying is
dead-lettered, dead letters are redriven, an envelope retry after its receiver died runs the
signal, and a Lambda function with no backend refuses to run uncoordinated.

The protocol rows named here (Q8, Q9, G5, C4, V1, D4) are in docs/protocol.md; the explorer
(``make model-check``) and the differential suite check the same rows exhaustively and
against the model.
"""

from __future__ import annotations

import json
import threading
import warnings
from dataclasses import replace
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from botocore.stub import ANY, Stubber
from moto import mock_aws

from leaseguard import (
    ConfigurationError,
    HandoffConfig,
    InMemoryLeaseProvider,
    PayloadTooLarge,
    QueueFull,
    RetryConfig,
    Signal,
    current_lease,
    lease_owned,
)
from leaseguard.config import ProviderConfig, provider_from_env
from leaseguard.errors import InvalidLeaseArgument
from leaseguard.handoff import Envelope
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.testing import LambdaContext
from tests.conftest import ProviderFactory, let_leases_expire
from tests.test_guard import CountingMetrics, http_event
from tests.test_guard_integrations import sqs_record

TTL = 3_000


class Holder:
    """Holds a key in a background invocation until released."""

    def __init__(self, handler: Any, event: Any) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=handler, args=(event, LambdaContext()))

    def __enter__(self) -> Holder:
        self.thread.start()
        assert self.inside.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(20)
        assert not self.thread.is_alive()


# -- Q8: a bounded queue -----------------------------------------------------------------------


def test_a_full_queue_refuses_the_forward_and_stores_nothing(provider: BaseLeaseProvider) -> None:
    provider.acquire_or_enqueue("q", Signal("owner", {}), TTL)
    provider.acquire_or_enqueue("q", Signal("a", {"n": 1}), TTL, max_queue=2)
    provider.acquire_or_enqueue("q", Signal("b", {"n": 2}), TTL, max_queue=2)
    before = replace(provider.inspect_key("q"), remaining_ms=None)
    with pytest.raises(QueueFull) as refused:
        provider.acquire_or_enqueue("q", Signal("c", {"n": 3}), TTL, max_queue=2)
    assert (refused.value.depth, refused.value.limit, refused.value.holder) == (2, 2, "owner")
    assert "max_queue is 2" in str(refused.value)
    assert replace(provider.inspect_key("q"), remaining_ms=None) == before
    # Already queued: answered with its place, not refused (a resend of an accepted forward).
    again = provider.acquire_or_enqueue("q", Signal("a", {"n": 1}), TTL, max_queue=2)
    assert again.position == 1
    with pytest.raises(InvalidLeaseArgument):
        provider.acquire_or_enqueue("q", Signal("d", {}), TTL, max_queue=0)


def test_api_gateway_gets_429_and_a_direct_call_raises_when_the_queue_is_full(
    provider: BaseLeaseProvider,
) -> None:
    metrics = CountingMetrics()
    holder: Holder

    @lease_owned(
        lambda e: e.get("pathParameters", e).get("threadId") or e["k"],
        provider=provider,
        ttl_ms=TTL,
        max_queue=1,
        metrics=metrics,
    )
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        if event.get("body") == "hold":
            holder.inside.set()
            holder.release.wait(10)
        return {"statusCode": 200}

    with (holder := Holder(handler, http_event("t", "hold"))):
        first = handler(http_event("t", "one"), LambdaContext())
        assert first["statusCode"] == 202
        assert json.loads(first["body"])["leaseguard"]["position"] == 1
        full = handler(http_event("t", "two"), LambdaContext())
        assert full["statusCode"] == 429
        assert json.loads(full["body"])["leaseguard"]["max_queue"] == 1
        with pytest.raises(QueueFull):
            handler({"k": "t", "body": "direct"}, LambdaContext())
        assert [s.payload["body"] for s in provider.inspect_key("t").queued] == ["one"]
    assert metrics.values["QueueDepth"] == [1]
    assert metrics.names.count("QueueFull") == 2


def test_a_full_queue_turns_an_sqs_record_into_a_batch_item_failure(
    provider: BaseLeaseProvider,
) -> None:
    processor = BatchProcessor(event_type=EventType.SQS)
    holder: Holder

    @lease_owned(
        lambda record: record.json_body["orderId"], provider=provider, ttl_ms=TTL, max_queue=1
    )
    def record_handler(record: SQSRecord, lambda_context: Any = None) -> str:
        if record.json_body["note"] == "hold":
            holder.inside.set()
            holder.release.wait(10)
        return str(record.message_id)

    def lambda_handler(event: dict[str, Any], context: Any) -> Any:
        return process_partial_response(event, record_handler, processor, context)

    with (holder := Holder(lambda_handler, {"Records": [sqs_record("m0", "A", "hold")]})):
        batch = {"Records": [sqs_record("m1", "A", "queued"), sqs_record("m2", "A", "full")]}
        response = lambda_handler(batch, LambdaContext())
        # m1 waits in the queue (processed as far as SQS is concerned); m2 comes back later.
        assert response == {"batchItemFailures": [{"itemIdentifier": "m2"}]}
    assert provider.inspect_key("A").queued == ()


# -- G6 halt, Q9, D4, V1: strict order past a poison signal -------------------------------------


def test_halt_keeps_strict_order_until_the_dead_letter_is_redriven(
    provider: BaseLeaseProvider,
) -> None:
    ran: list[str] = []
    poison = {"bad": True}
    holder: Holder

    @lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=TTL,
        retries=RetryConfig(max_attempts=2, on_poison="halt"),
    )
    def handler(event: dict[str, Any], context: Any) -> Any:
        if event["n"] == "hold":
            holder.inside.set()
            holder.release.wait(10)
        ran.append(event["n"])
        if event["n"] == "poison" and poison["bad"]:
            raise ValueError("poison")
        return str(event["n"])

    with (holder := Holder(handler, {"k": "h", "n": "hold"})):
        handler({"k": "h", "n": "poison"}, LambdaContext())
        handler({"k": "h", "n": "after"}, LambdaContext())
    assert ran == ["hold", "poison", "poison"]  # "after" waits behind the dead letter
    state = provider.inspect_key("h")
    assert state.halted and state.owner is None
    assert [d.payload["n"] for d in state.dead_letters] == ["poison"]
    assert [s.payload["n"] for s in state.queued] == ["after"]
    assert provider.adopt_orphans(TTL, 10) == []  # [D4] the sweeper leaves it alone
    assert "h" in provider.dead_letter_keys()
    # [Q9] a new event on the halted key queues too, it does not run
    late = handler({"k": "h", "n": "late"}, LambdaContext())
    assert late["leaseguard"]["position"] == 2 and late["leaseguard"]["holder"] is None
    assert ran == ["hold", "poison", "poison"]

    poison["bad"] = False
    assert provider.redrive("h") == 1  # [V1]
    assert provider.redrive("h") == 0  # a resend of it moves nothing more
    state = provider.inspect_key("h")
    assert not state.halted and not state.dead_letters
    assert [s.payload["n"] for s in state.queued] == ["poison", "after", "late"]
    assert provider.redrive("h") == 0
    assert "h" not in provider.dead_letter_keys()
    handler({"k": "h", "n": "next"}, LambdaContext())  # adopts the redriven work (Q6)
    assert ran[3:] == ["poison", "after", "late", "next"]
    assert provider.inspect_key("h").owner is None


def test_redrive_of_chosen_ids_and_bad_arguments(provider: BaseLeaseProvider) -> None:
    provider.acquire_or_enqueue("r", Signal("own", {}), TTL)
    for sid in ("a", "b"):
        provider.acquire_or_enqueue("r", Signal(sid, {"id": sid}), TTL)
    token = provider.inspect_key("r").token
    assert provider.take_signals("r", "own", 10, token=token)
    provider.transfer_to_next("r", "own", TTL, token=token, error="boom", max_attempts=1)
    assert [d.id for d in provider.inspect_key("r").dead_letters] == ["own", "a", "b"]
    with pytest.raises(InvalidLeaseArgument):
        provider.redrive("r", "a")  # a str is not a list of ids
    with pytest.raises(InvalidLeaseArgument):
        provider.redrive("r", [])
    assert provider.redrive("r", ["b", "missing"]) == 1
    state = provider.inspect_key("r")
    assert [d.id for d in state.dead_letters] == ["own", "a"]
    assert [(s.id, s.attempts) for s in state.queued] == [("b", 0)]


def test_a_resent_redrive_answers_what_it_moved_on_memory() -> None:
    """[V3] on the model (and so memory): the same call again (a resend: the same nonce) after
    another signal died answers what the call moved and moves nothing more; the memory of it is
    one entry, forgotten with the dedupe window (G2), after which the record can be forgotten."""
    from leaseguard.protocol.model import DEDUPE_WINDOW_MS, TOKEN_MEMORY_MS
    from leaseguard.providers import memory as memory_module
    from tests.differential import Clock, _nonces

    clock = Clock(1_000_000)
    provider = InMemoryLeaseProvider(clock=clock)

    def die(sid: str) -> None:
        held = provider.acquire_or_enqueue("v", Signal(sid, {}), TTL)
        provider.transfer_to_next("v", sid, TTL, token=held.token, error="x", max_attempts=1)

    die("a")
    drawn: list[str] = []
    with _nonces(memory_module, [], drawn):
        assert provider.redrive("v") == 1
    (adopted,) = provider.adopt_orphans(TTL, 10, claim=True)  # a runs, then b dies
    provider.transfer_to_next("v", "a", TTL, token=adopted[1].token)
    die("b")
    with _nonces(memory_module, drawn):
        assert provider.redrive("v") == 1  # the resend: what it moved, not 0
    assert [d.id for d in provider.inspect_key("v").dead_letters] == ["b"]
    remembered = provider.record("v").redriven
    assert remembered is not None and (remembered.nonce, remembered.moved) == (drawn[0], 1)
    # The memory is bounded: one entry, replaced by the next redrive that moves something.
    assert provider.redrive("v", ["b"]) == 1
    assert provider.record("v").redriven.nonce != drawn[0]  # type: ignore[union-attr]
    (adopted,) = provider.adopt_orphans(TTL, 10, claim=True)
    provider.transfer_to_next("v", "b", TTL, token=adopted[1].token)
    # ... and forgotten with the dedupe window; then the idle record goes.
    clock.now += DEDUPE_WINDOW_MS + TOKEN_MEMORY_MS + 1
    rec = provider.record("v")
    assert rec.redriven is None and rec.forgettable(clock.now)


# -- G5: a signal whose runs keep dying ----------------------------------------------------------


def test_a_signal_whose_runs_never_finish_is_dead_lettered_without_running_again(
    provider: BaseLeaseProvider,
) -> None:
    ran: list[str] = []

    @lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, retries=RetryConfig(max_attempts=2)
    )
    def handler(event: dict[str, Any], context: Any) -> str:
        ran.append(event["n"])
        return str(event["n"])

    provider.acquire_lease("c", "dead", TTL)
    provider.acquire_or_enqueue("c", Signal("s", {"k": "c", "n": "crasher"}), TTL)
    let_leases_expire(provider, ("c", "dead"))
    # Two owners of "s" die mid-run (adopted, then their leases run out): each counts.
    for attempts in (0, 1):
        (adopted,) = provider.adopt_orphans(TTL, 10, claim=True)
        assert adopted[1].id == "s" and adopted[1].attempts == attempts
        let_leases_expire(provider, ("c", "s"))
    assert handler({"k": "c", "n": "new"}, LambdaContext()) == "new"
    assert ran == ["new"]  # the crasher is not run a third time
    state = provider.inspect_key("c")
    (dead,) = state.dead_letters
    assert dead.id == "s" and dead.attempts == 3 and "did not finish" in dead.error
    assert state.owner is None and not state.queued


# -- G6: a bounded dead-letter list ---------------------------------------------------------


def _fail(provider: BaseLeaseProvider, key: str, sid: str, **report: Any) -> Signal | None:
    """``sid`` owns ``key`` (a grant of its own); its run fails on its last attempt."""
    granted = provider.acquire_or_enqueue(key, Signal(sid, {"n": sid}), TTL)
    assert granted.acquired and granted.owner == sid
    return provider.transfer_to_next(
        key, sid, TTL, token=granted.token, error=f"{sid} failed", max_attempts=1, **report
    )


def _complete(provider: BaseLeaseProvider, key: str, signal: Signal | None) -> list[str]:
    """Run ``signal`` and every signal handed on after it to success: the ids, in order."""
    ran: list[str] = []
    while signal is not None:
        ran.append(signal.id)
        signal = provider.transfer_to_next(key, signal.id, TTL, token=signal.token)
    return ran


def test_past_the_dead_letter_bound_a_failed_signal_stays_queued_and_halts_the_key(
    make_provider: ProviderFactory, lease_backend: str
) -> None:
    """[G6] with ``dead_limit`` dead letters on the key, a failure that would dead-letter one
    more keeps it at the head of the queue with its count (the invocation's own event too,
    requeue_owner=False) and halts the key: nothing queued runs, new events queue (Q9), the
    sweeper leaves it (D4). A redrive (V1) frees the list and resumes the key; nothing is
    lost, and the list never holds more than the bound."""
    provider = make_provider(lease_backend)(dead_limit=2)
    key = "bounded"
    assert _fail(provider, key, "a") is None
    assert _fail(provider, key, "b") is None
    assert [d.id for d in provider.inspect_key(key).dead_letters] == ["a", "b"]
    owner = provider.acquire_or_enqueue(key, Signal("c", {"n": "c"}), TTL)
    assert owner.acquired  # on_poison="skip": the dead letters alone do not halt
    behind = provider.acquire_or_enqueue(key, Signal("d", {"n": "d"}), TTL)
    assert behind.position == 1
    handed = provider.transfer_to_next(
        key, "c", TTL, token=owner.token, error="c failed", max_attempts=1, requeue_owner=False
    )
    assert handed is None  # [N1] halted: released, d not granted
    state = provider.inspect_key(key)
    assert state.halted and state.owner is None
    assert [d.id for d in state.dead_letters] == ["a", "b"]  # the bound held
    assert [(s.id, s.attempts) for s in state.queued] == [("c", 1), ("d", 0)]
    assert key in provider.dead_letter_keys()
    late = provider.acquire_or_enqueue(key, Signal("e", {"n": "e"}), TTL)
    assert not late.acquired and late.owner is None and late.position == 3  # [Q9]
    assert provider.adopt_orphans(TTL, 10) == []  # [D4]
    assert provider.acquire_or_enqueue(key, Signal("c", {"n": "c"}), TTL).position == 1  # [Q3]

    assert provider.redrive(key) == 2  # [V1] the list is free; the key resumes
    state = provider.inspect_key(key)
    assert not state.halted and not state.dead_letters
    assert [(s.id, s.attempts) for s in state.queued] == [
        ("a", 0), ("b", 0), ("c", 1), ("d", 0), ("e", 0),
    ]  # fmt: skip
    ((_, head),) = provider.adopt_orphans(TTL, 10, claim=True)
    ran = _complete(provider, key, head)
    # c, at max_attempts, is handed on with its count (the guard dead-letters it unrun);
    # here it simply succeeds
    assert ran == ["a", "b", "c", "d", "e"]
    state = provider.inspect_key(key)
    assert not state.queued and not state.dead_letters and not state.halted


def test_a_full_dead_letter_list_keeps_a_batchs_failed_items_in_order(
    make_provider: ProviderFactory, lease_backend: str
) -> None:
    """[G8] a partial report with no room for its failed items: each goes back to the head in
    in-flight order with its count, the item that never ran with its count unchanged, the
    completed one done; the key halts with the list at its bound of one."""
    provider = make_provider(lease_backend)(dead_limit=1)
    key = "batch"
    assert _fail(provider, key, "poison") is None
    owner = provider.acquire_or_enqueue(key, Signal("own", {}), TTL)
    for sid in ("x", "y", "z"):
        provider.acquire_or_enqueue(key, Signal(sid, {}), TTL)
    assert [s.id for s in provider.take_signals(key, "own", 3, token=owner.token)] == [
        "x", "y", "z",
    ]  # fmt: skip
    reply = provider.transfer_to_next(
        key,
        "own",
        TTL,
        token=owner.token,
        error="boom",
        max_attempts=1,
        completed=["own", "x"],
        failed=["y"],
    )
    assert reply is None
    state = provider.inspect_key(key)
    assert state.halted and [d.id for d in state.dead_letters] == ["poison"]
    assert [(s.id, s.attempts) for s in state.queued] == [("y", 1), ("z", 0)]
    again = provider.acquire_or_enqueue(key, Signal("x", {}), TTL)
    assert not again.acquired and again.position is None  # [Q5] x completed


def test_dead_limit_is_at_most_the_protocols_bound() -> None:
    from leaseguard.protocol.state import DEAD_LIMIT

    assert InMemoryLeaseProvider(dead_limit=DEAD_LIMIT).dead_limit == DEAD_LIMIT
    for bad in (0, DEAD_LIMIT + 1):
        with pytest.raises(InvalidLeaseArgument):
            InMemoryLeaseProvider(dead_limit=bad)


def test_dead_limit_comes_from_the_environment_on_every_backend(
    monkeypatch: Any, redis_url: str
) -> None:
    """LEASEGUARD_DEAD_LIMIT reaches every provider the environment builds (and from_url); a
    bad one is a ConfigurationError naming the variable, before any client is made."""
    from leaseguard.providers.redis import RedisLeaseProvider

    monkeypatch.setenv("LEASEGUARD_DEAD_LIMIT", "7")
    for backend, more in (
        ("memory", {}),
        ("redis", {"LEASEGUARD_REDIS_URL": redis_url}),
        ("dynamodb", {"LEASEGUARD_TABLE_NAME": "leases", "AWS_DEFAULT_REGION": "us-east-1"}),
    ):
        monkeypatch.setenv("LEASEGUARD_BACKEND", backend)
        for name, value in more.items():
            monkeypatch.setenv(name, value)
        assert ProviderConfig.from_env().build().dead_limit == 7, backend
    assert RedisLeaseProvider.from_url(redis_url, dead_limit=2).dead_limit == 2
    for bad in ("0", "101", "x"):
        monkeypatch.setenv("LEASEGUARD_DEAD_LIMIT", bad)
        with pytest.raises(ConfigurationError, match="LEASEGUARD_DEAD_LIMIT"):
            ProviderConfig.from_env()


def test_an_unclaimed_grant_that_expires_three_times_keeps_its_attempts(
    provider: BaseLeaseProvider,
) -> None:
    """[G5] Issue 23 finding 1b: a hand-off grant whose envelope came late never started, so
    its expiry charges nothing (via D1, Q6 and C4 alike); the late envelope then runs it."""
    ran: list[str] = []

    @lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, retries=RetryConfig(max_attempts=3)
    )
    def handler(event: dict[str, Any], context: Any) -> Any:
        ran.append(event["n"])
        return str(event["n"])

    provider.acquire_or_enqueue("u", Signal("first", {"k": "u", "n": "first"}), TTL)
    provider.acquire_or_enqueue("u", Signal("late", {"k": "u", "n": "late"}), TTL)
    grant = provider.transfer_to_next(
        "u",
        "first",
        TTL,
        claim=False,
    )
    assert grant is not None and grant.id == "late" and grant.attempts == 0
    for _ in range(2):  # [D1] the sweeper adopts it, unclaimed; its envelope is late again
        let_leases_expire(provider, ("u", "late"))
        (adopted,) = provider.adopt_orphans(TTL, 10)
        assert adopted[1].id == "late" and adopted[1].attempts == 0
        grant = adopted[1]
    let_leases_expire(provider, ("u", "late"))
    assert grant.token is not None
    envelope = Envelope("u", grant.id, grant.token, grant.payload).to_event()
    handler(envelope, LambdaContext())  # [C4] the third late envelope: it runs, uncharged
    assert ran == ["late"]
    state = provider.inspect_key("u")
    assert not state.dead_letters and state.owner is None and not state.queued


def test_a_batch_owner_that_dies_charges_only_the_item_it_was_running(
    provider: BaseLeaseProvider,
) -> None:
    """[K1] [G5] Issue 23 finding 1a: a batch owner reports each item's success with the take
    of the next (``completed=``), so its crash charges only the item that was running: the
    ones before it are done (a duplicate delivery of one is answered duplicate, not run), the
    ones after it never left the queue."""
    grant = provider.acquire_or_enqueue("b", Signal("owner", {"n": "owner"}), TTL)
    token = grant.token
    assert grant.acquired and token is not None
    for sid in ("s1", "s2", "s3", "s4"):
        provider.acquire_or_enqueue("b", Signal(sid, {"n": sid}), TTL)
    (first,) = provider.take_signals("b", "owner", 1, token=token, completed=["owner"])
    (second,) = provider.take_signals("b", "owner", 1, token=token, completed=[first.id])
    assert (first.id, second.id) == ("s1", "s2")
    assert provider.inspect_key("b").in_flight in (("s2",), ("owner", "s2"))
    let_leases_expire(provider, ("b", "owner"))  # the owner dies running s2
    (adopted,) = provider.adopt_orphans(TTL, 10, claim=True)
    assert (adopted[1].id, adopted[1].attempts) == ("s2", 1)  # only the running item charged
    state = provider.inspect_key("b")
    assert [(s.id, s.attempts) for s in state.queued] == [("s3", 0), ("s4", 0)]
    assert not state.dead_letters
    again = provider.acquire_or_enqueue("b", Signal("s1", {"n": "s1"}), TTL)
    # [Q5] s1 completed before the crash: answered as done (no place in the queue), never run
    assert (again.acquired, again.position) == (False, None)
    assert [s.id for s in provider.inspect_key("b").queued] == ["s3", "s4"]


# -- C4: an envelope retried after its receiver died ---------------------------------------------


def test_a_retried_envelope_runs_the_signal_after_its_receiver_died(
    provider: BaseLeaseProvider,
) -> None:
    ran: list[tuple[str, int]] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL)
    def handler(event: dict[str, Any], context: Any) -> Any:
        ran.append((event["n"], current_lease().token or 0))
        return str(event["n"])

    provider.acquire_or_enqueue("e", Signal("first", {"k": "e", "n": "first"}), TTL)
    provider.acquire_or_enqueue("e", Signal("next", {"k": "e", "n": "next"}), TTL)
    first_token = provider.inspect_key("e").token
    grant = provider.transfer_to_next("e", "first", TTL, claim=False, token=first_token)
    assert grant is not None and grant.token is not None
    envelope = Envelope("e", grant.id, grant.token, grant.payload).to_event()
    assert provider.claim_signal("e", grant.id, grant.token, TTL) is not None  # receiver 1
    let_leases_expire(provider, ("e", "next"))  # ... which died mid-run
    handler(envelope, LambdaContext())  # Lambda's retry of the same envelope
    assert [n for n, _ in ran] == ["next"] and ran[0][1] > grant.token
    # A duplicate of the envelope now finds the work done and runs nothing.
    assert handler(envelope, LambdaContext())["leaseguard"]["status"] == "rejected"
    state = provider.inspect_key("e")
    assert state.owner is None and not state.queued and not state.in_flight


# -- dead letters copied to an SQS queue --------------------------------------------------------


def test_dead_letters_are_copied_to_the_dead_letter_queue(fake_aws_env: None) -> None:
    provider = InMemoryLeaseProvider()
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="leaseguard-dead-letters")["QueueUrl"]
        holder: Holder

        @lease_owned(
            lambda e: e["k"],
            provider=provider,
            ttl_ms=TTL,
            handoff=HandoffConfig(sqs_client=sqs),
            retries=RetryConfig(max_attempts=1, dead_letter_queue_url=url),
        )
        def handler(event: dict[str, Any], context: Any) -> str:
            if event["n"] == "hold":
                holder.inside.set()
                holder.release.wait(10)
            if event["n"] == "poison":
                raise ValueError("cannot parse")
            return str(event["n"])

        with (holder := Holder(handler, {"k": "d", "n": "hold"})):
            handler({"k": "d", "n": "poison"}, LambdaContext())
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    (body,) = [json.loads(m["Body"]) for m in messages]
    assert body["key"] == "d" and body["payload"] == {"k": "d", "n": "poison"}
    assert body["attempts"] == 1 and "cannot parse" in body["error"]
    assert [d.payload["n"] for d in provider.inspect_key("d").dead_letters] == ["poison"]


def test_a_signal_kept_for_a_full_dead_letter_list_is_not_reported_dead_lettered(
    make_provider: ProviderFactory, lease_backend: str, fake_aws_env: None
) -> None:
    """[G6] invariant (n): the guard does not tell people a signal was dead-lettered when the
    key kept it instead (its dead-letter list full, the key halted). The first poison event
    is dead-lettered (counted, copied to the dead-letter queue); the second is kept at the
    head of the queue: counted ``SignalKeptHalted``, logged as kept, and not copied."""
    provider = make_provider(lease_backend)(dead_limit=1)
    metrics = CountingMetrics()
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="leaseguard-dead-letters")["QueueUrl"]

        @lease_owned(
            lambda e: e["k"],
            provider=provider,
            ttl_ms=TTL,
            metrics=metrics,
            handoff=HandoffConfig(sqs_client=sqs),
            retries=RetryConfig(max_attempts=1, dead_letter_queue_url=url),
        )
        def handler(event: dict[str, Any], context: Any) -> str:
            raise ValueError(f"cannot parse {event['n']}")

        for poison in ("first", "second"):
            with pytest.raises(ValueError, match="cannot parse"):
                handler({"k": "full", "n": poison}, LambdaContext())
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    assert [json.loads(m["Body"])["payload"]["n"] for m in messages] == ["first"]
    assert metrics.names.count("SignalDeadLettered") == 1
    assert metrics.names.count("SignalKeptHalted") == 1
    state = provider.inspect_key("full")
    assert [d.payload["n"] for d in state.dead_letters] == ["first"]
    assert state.halted and [s.payload["n"] for s in state.queued] == ["second"]


def test_max_attempts_comes_from_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("LEASEGUARD_MAX_ATTEMPTS", "5")
    guarded = lease_owned("k", provider=InMemoryLeaseProvider())(lambda e, c: None)
    assert guarded.__leaseguard__.options.max_attempts == 5  # type: ignore[attr-defined]
    monkeypatch.setenv("LEASEGUARD_MAX_ATTEMPTS", "five")
    with pytest.raises(ConfigurationError, match="LEASEGUARD_MAX_ATTEMPTS"):
        lease_owned("k", provider=InMemoryLeaseProvider())(lambda e, c: None)
    monkeypatch.delenv("LEASEGUARD_MAX_ATTEMPTS")
    with pytest.raises(ConfigurationError, match="on_poison"):
        lease_owned("k", retries=RetryConfig(on_poison="stop"))(lambda e, c: None)  # type: ignore[arg-type]


# -- fail closed ---------------------------------------------------------------------------------


def test_a_lambda_function_with_no_backend_fails_closed(monkeypatch: Any) -> None:
    for name in ("LEASEGUARD_BACKEND", "LEASEGUARD_REDIS_URL", "LEASEGUARD_TABLE_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders")
    provider_from_env.cache_clear()
    ran: list[Any] = []

    def append(event: Any, context: Any) -> None:
        ran.append(event)

    handler = lease_owned("k")(append)
    try:
        with pytest.raises(ConfigurationError, match="LEASEGUARD_BACKEND=redis"):
            handler({"k": "x"}, LambdaContext())
        assert ran == []
        # Uncoordinated on purpose: an explicit choice, no error.
        monkeypatch.setenv("LEASEGUARD_BACKEND", "noop")
        provider_from_env.cache_clear()
        handler({"k": "x"}, LambdaContext())
        assert ran == [{"k": "x"}]
    finally:
        provider_from_env.cache_clear()
    # Outside Lambda the no-op fallback stays, with a warning.
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME")
    monkeypatch.delenv("LEASEGUARD_BACKEND")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ProviderConfig.from_env().backend == "noop"
    assert any("no-op provider" in str(w.message) for w in caught)


# -- sizes: anything Lambda can deliver ----------------------------------------------------------

LAMBDA_SYNC_LIMIT = 6 * 1024 * 1024


@pytest.mark.parametrize("size", [300_000, 1_048_576, LAMBDA_SYNC_LIMIT - 1_000])
def test_a_forwarded_event_up_to_the_lambda_limit_is_stored(
    provider: BaseLeaseProvider, size: int
) -> None:
    """Up to 6 MB (a synchronous invocation's limit; 1 MB async, 256 KiB an SQS body): stored
    whole on every backend (on DynamoDB, split across items) and given back unchanged."""
    payload = {"body": "x" * (size - 20)}
    provider.acquire_or_enqueue("big", Signal("owner", {}), TTL)
    assert provider.acquire_or_enqueue("big", Signal("large", payload), TTL).position == 1
    (queued,) = provider.inspect_key("big").queued
    assert queued.payload == payload
    token = provider.inspect_key("big").token
    nxt = provider.transfer_to_next("big", "owner", TTL, token=token)
    assert nxt is not None and nxt.id == "large" and nxt.payload == payload
    assert provider.transfer_to_next("big", "large", TTL, token=nxt.token) is None


def test_an_event_over_the_limit_is_refused_before_any_write(
    provider: BaseLeaseProvider,
) -> None:
    @lease_owned(lambda e: e["pathParameters"]["threadId"], provider=provider, ttl_ms=TTL)
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"statusCode": 200}

    huge = http_event("z", "x" * (LAMBDA_SYNC_LIMIT + 10))
    answer = handler(huge, LambdaContext())
    assert answer["statusCode"] == 413
    assert "the limit is" in json.loads(answer["body"])["leaseguard"]["reason"]
    with pytest.raises(PayloadTooLarge) as refused:
        handler({"pathParameters": {"threadId": "z"}, "b": huge["body"]}, LambdaContext())
    assert refused.value.limit == provider.max_payload_bytes
    state = provider.inspect_key("z")
    assert state.owner is None and not state.queued and not state.in_flight


# -- the response shape of an adopted chain ------------------------------------------------------


def test_an_adopted_chain_that_hands_off_answers_api_gateway_with_202(
    provider: BaseLeaseProvider,
) -> None:
    """The new event adopts an orphan, runs it, and hands its own event off by Invoke: API
    Gateway must get an HTTP answer (202), never the raw body (a REST proxy turns it into 502)."""
    client = boto3.client(
        "lambda", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stub = Stubber(client)
    stub.add_response(
        "invoke",
        {"StatusCode": 202},
        {"FunctionName": ANY, "InvocationType": "Event", "Payload": ANY},
    )
    ran: list[str] = []

    @lease_owned(
        lambda e: e["pathParameters"]["threadId"],
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig("invoke", lambda_client=client),
    )
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        ran.append(event["body"])
        return {"statusCode": 200, "body": event["body"]}

    provider.acquire_lease("a", "dead-owner", TTL)
    provider.acquire_or_enqueue("a", Signal("orphan", http_event("a", "orphan")), TTL)
    let_leases_expire(provider, ("a", "dead-owner"))
    with stub:
        answer = handler(http_event("a", "mine"), LambdaContext())
        stub.assert_no_pending_responses()
    assert ran == ["orphan"]
    assert answer["statusCode"] == 202
    assert json.loads(answer["body"])["leaseguard"]["status"] == "queued"


# -- the invocation's own event: the platform's retries count too --------------------------------


def test_an_own_event_failing_on_every_platform_retry_is_dead_lettered(
    provider: BaseLeaseProvider,
) -> None:
    """Lambda (or SQS) retries a failed invocation with the same request id (message id): each
    delivery's failure counts, and the last one is dead-lettered on the key with its payload,
    so the next retry is answered "dead_lettered" (not run) instead of failing forever."""
    ran: list[int] = []

    @lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, retries=RetryConfig(max_attempts=3)
    )
    def handler(event: dict[str, Any], context: Any) -> Any:
        ran.append(current_lease().token or 0)
        raise ValueError("always fails")

    context = LambdaContext()  # the platform's retries share the request id
    for attempt in range(3):
        with pytest.raises(ValueError):
            handler({"k": "own", "n": attempt}, context)
        state = provider.inspect_key("own")
        assert state.owner is None and not state.queued
        assert len(state.dead_letters) == (1 if attempt == 2 else 0)
    (dead,) = provider.inspect_key("own").dead_letters
    assert dead.id == context.aws_request_id and dead.attempts == 3
    assert dead.payload == {"k": "own", "n": 2} and "always fails" in dead.error
    again = handler({"k": "own", "n": 3}, context)  # a fourth delivery runs nothing
    assert again["leaseguard"]["status"] == "dead_lettered" and len(ran) == 3
