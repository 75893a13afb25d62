"""``@lease_owned`` in one process, on every backend (``lease_backend`` fixture).

Concurrency across processes is in ``test_guard_processes.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from leaseguard import (
    ConfigurationError,
    HandoffConfig,
    LeaseBackendError,
    LeaseLostError,
    NoActiveLease,
    Signal,
    current_lease,
    lease_owned,
)
from leaseguard.errors import HandlerKeyError
from leaseguard.handoff import ENVELOPE_FIELD, Envelope
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.testing import LambdaContext

from .conftest import let_leases_expire
from .handoffs import RecordingLambda

TTL = 3_000


def http_event(thread: str, body: str = "hi") -> dict[str, Any]:
    return {
        "version": "2.0",
        "routeKey": "POST /threads/{threadId}/messages",
        "requestContext": {"http": {"method": "POST"}, "requestId": "x"},
        "pathParameters": {"threadId": thread},
        "body": body,
    }


def rest_event(thread: str) -> dict[str, Any]:
    return {
        "resource": "/threads/{threadId}/messages",
        "httpMethod": "POST",
        "requestContext": {"resourcePath": "/threads/{threadId}/messages"},
        "pathParameters": {"threadId": thread},
        "body": "hi",
    }


def renew_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("leaseguard-renew")]


class Recorder:
    """A guarded handler that records what it saw; ``gate`` holds it inside the lease."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, str, int | None]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.inside = threading.Event()

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        lease = current_lease()
        self.seen.append((event.get("body", event.get("n")), lease.owner, lease.token))
        self.inside.set()
        self.gate.wait(10)
        return {"statusCode": 200, "body": event.get("body")}


def hold_in_background(handler: Any, event: Any, recorder: Recorder) -> threading.Thread:
    recorder.gate.clear()
    recorder.inside.clear()
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(r=handler(event, LambdaContext())))
    thread.start()
    assert recorder.inside.wait(10)
    thread.result = result  # type: ignore[attr-defined]
    return thread


def test_owner_runs_and_returns_the_handler_result(provider: BaseLeaseProvider) -> None:
    recorder = Recorder()
    handler = lease_owned("pathParameters.threadId", provider=provider, ttl_ms=TTL)(recorder)
    ctx = LambdaContext()
    assert handler(http_event("t1", "a"), ctx) == {"statusCode": 200, "body": "a"}
    assert recorder.seen[0][:2] == ("a", ctx.aws_request_id)
    assert provider.get_lease_owner("t1") is None  # released: nothing queued
    assert renew_threads() == []


@pytest.mark.parametrize("make_event", [http_event, rest_event], ids=["http-api", "rest-api"])
def test_held_key_forwards_with_202_for_api_gateway(
    provider: BaseLeaseProvider, make_event: Any
) -> None:
    recorder = Recorder()
    client = RecordingLambda()
    guard = lease_owned(
        "pathParameters.threadId",
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(lambda_client=client),
    )
    handler = guard(recorder)
    owner = hold_in_background(handler, http_event("t1", "first"), recorder)
    ctx = LambdaContext()
    response = handler(make_event("t1"), ctx)
    assert response["statusCode"] == 202
    body = json.loads(response["body"])["leaseguard"]
    assert body["status"] == "forwarded" and body["key"] == "t1"
    assert body["holder"] == recorder.seen[0][1] and body["position"] == 1
    assert body["signal_id"] == ctx.aws_request_id
    assert len(recorder.seen) == 1  # the forwarded handler did not run here
    recorder.gate.set()
    owner.join()
    # The owner's caller waits: answered after its own run, the forwarded event handed off
    assert owner.result == {"r": {"statusCode": 200, "body": "first"}}  # type: ignore[attr-defined]
    assert [s[0] for s in recorder.seen] == ["first"] and len(client.pending()) == 1
    assert client.deliver(handler) == [{"statusCode": 200, "body": "hi"}]
    assert [s[0] for s in recorder.seen] == ["first", "hi"]


def test_forwarded_plain_event_gets_a_body_not_http(provider: BaseLeaseProvider) -> None:
    recorder = Recorder()
    handler = lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL)(recorder)
    owner = hold_in_background(handler, {"k": "x", "n": 1}, recorder)
    result = handler({"k": "x", "n": 2}, LambdaContext())
    assert result["leaseguard"]["status"] == "forwarded"
    assert "statusCode" not in result
    recorder.gate.set()
    owner.join()
    assert [s[0] for s in recorder.seen] == [1, 2]


def test_forwarded_events_run_in_arrival_order_with_rising_tokens(
    provider: BaseLeaseProvider,
) -> None:
    recorder = Recorder()
    handler = lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL)(recorder)
    owner = hold_in_background(handler, {"k": "x", "n": 0}, recorder)
    for n in range(1, 6):
        assert handler({"k": "x", "n": n}, LambdaContext())["leaseguard"]["position"] == n
    recorder.gate.set()
    owner.join()
    assert [s[0] for s in recorder.seen] == [0, 1, 2, 3, 4, 5]
    tokens = [s[2] for s in recorder.seen]
    assert all(a is not None and b is not None and b > a for a, b in itertools.pairwise(tokens))
    assert provider.get_lease_owner("x") is None


def test_take_signals_drains_follow_ups(provider: BaseLeaseProvider) -> None:
    drained: list[Any] = []
    started, release = threading.Event(), threading.Event()

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL)
    def handler(event: dict[str, Any], context: Any) -> str:
        started.set()
        release.wait(10)
        drained.extend(s.payload["n"] for s in current_lease().take_signals(10))
        return "done"

    thread = threading.Thread(target=handler, args=({"k": "d", "n": 0}, LambdaContext()))
    thread.start()
    assert started.wait(10)
    for n in (1, 2):
        handler({"k": "d", "n": n}, LambdaContext())
    release.set()
    thread.join()
    assert drained == [1, 2]
    assert provider.inspect_key("d").owner is None  # nothing left: released


# -- key functions ------------------------------------------------------------------------------


def test_key_function_errors_name_the_handler(provider: BaseLeaseProvider) -> None:
    def my_handler(event: Any, context: Any) -> None:
        raise AssertionError("must not run")

    cases: list[tuple[Any, Any, str]] = [
        (lambda e: e["missing"], {}, "raised KeyError"),
        (lambda e: 42, {}, "returned int 42"),
        (lambda e: "", {}, "returned str ''"),
        ("pathParameters.threadId", {"body": "no path"}, "nothing at"),
        (lambda e: "k" * 2000, {}, "1 KiB|limit is 1024"),
    ]
    for key_fn, event, message in cases:
        guarded = lease_owned(key_fn, provider=provider, ttl_ms=TTL)(my_handler)
        with pytest.raises(HandlerKeyError, match=message) as info:
            guarded(event, LambdaContext())
        assert "my_handler" in str(info.value)


def test_bad_decorator_options_fail_at_decoration_time(provider: BaseLeaseProvider) -> None:
    def fn(event: Any, context: Any) -> None:
        return None

    for options in (
        {"ttl_ms": 0},
        {"ttl_ms": 1.5},
        {"ttl_ms": 1000, "renew_every_ms": 1000},
        {"handoff": "carrier-pigeon"},
        {"handoff": "sqs"},
        {"provider": object()},
        {"handoff": HandoffConfig(margin_ms=-1)},
    ):
        merged: dict[str, Any] = {"provider": provider, **options}
        with pytest.raises(ConfigurationError):
            lease_owned("a.b", **merged)(fn)
    with pytest.raises(ConfigurationError, match="JMESPath"):
        lease_owned("a.[", provider=provider)(fn)


def test_current_lease_outside_a_handler_is_a_clear_error() -> None:
    with pytest.raises(NoActiveLease, match="@lease_owned"):
        current_lease()


# -- renewal and loss ---------------------------------------------------------------------------


def test_handler_three_times_the_ttl_keeps_its_lease(provider: BaseLeaseProvider) -> None:
    # moto answers in tens of ms, far more on a loaded machine: a longer TTL there keeps the
    # test about renewal, not about moto's latency.
    ttl = short_ttl(provider)
    contested: list[bool] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=ttl)
    def slow(event: Any, context: Any) -> bool:
        deadline = time.monotonic() + 3 * ttl / 1000
        while time.monotonic() < deadline:
            contested.append(provider.acquire_lease("slow", "intruder", ttl).acquired)
            time.sleep(0.05)
        return current_lease().lost

    assert slow({"k": "slow"}, LambdaContext()) is False
    assert contested and not any(contested)
    assert renew_threads() == []


def test_renewal_thread_is_joined_when_the_handler_raises(provider: BaseLeaseProvider) -> None:
    # A renewal runs during the handler (every 666 ms) with 1.2 s of TTL left at its end.
    handles: list[Any] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=2_000)
    def boom(event: Any, context: Any) -> None:
        handles.append(current_lease())
        time.sleep(0.8)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        boom({"k": "r"}, LambdaContext())
    assert renew_threads() == []
    (handle,) = handles
    # handed off (released) before re-raising; only a lease the run had lost (a machine too
    # loaded to renew in time, which the handle then says) is left to run out instead
    assert provider.get_lease_owner("r") is None or handle.lost


def short_ttl(provider: BaseLeaseProvider) -> int:
    """A TTL short enough to run out within a test: 300 ms, and 1.5 s on DynamoDB, where moto
    answers in tens of ms and far more on a loaded machine (a 300 ms lease there could run out
    before the handler's first call, which is not what these tests are about)."""
    return 1_500 if type(provider).__name__ == "DynamoDBLeaseProvider" else 300


def test_deleted_lease_marks_lost_and_skips_handoff(provider: BaseLeaseProvider) -> None:
    lost: list[str] = []
    metrics = CountingMetrics()
    ttl = short_ttl(provider)

    @lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=ttl,
        on_lost=lambda h: lost.append(h.owner),
        metrics=metrics,
    )
    def victim(event: Any, context: Any) -> bool:
        lease = current_lease()
        lease.provider.release_lease(lease.key, lease.owner)  # someone deletes the lease
        provider.acquire_lease("v", "thief", 10_000)
        provider.acquire_or_enqueue("v", Signal("queued", {"k": "v"}), 10_000)
        time.sleep(ttl / 1000)  # a renewal (every third of the TTL) runs and is refused
        with pytest.raises(LeaseLostError):
            lease.check()
        return lease.lost

    ctx = LambdaContext()
    assert victim({"k": "v"}, ctx) is True
    assert lost == [ctx.aws_request_id]
    assert metrics.names.count("LeaseLost") == 1
    assert "LeaseHandedOff" not in metrics.names
    assert provider.get_lease_owner("v") == "thief"  # the lost owner handed nothing off
    assert provider.pending_signals("v") == 1


class CountingMetrics:
    """Collects ``add_metric`` calls the way a Powertools ``Metrics`` object receives them."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.values: dict[str, list[float]] = {}

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.names.append(name)
        self.values.setdefault(name, []).append(value)


def test_metrics_count_acquired_forwarded_handed_off(provider: BaseLeaseProvider) -> None:
    recorder = Recorder()
    metrics = CountingMetrics()
    handler = lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL, metrics=metrics)(
        recorder
    )
    owner = hold_in_background(handler, {"k": "m", "n": 0}, recorder)
    handler({"k": "m", "n": 1}, LambdaContext())
    recorder.gate.set()
    owner.join()
    for name in ("LeaseAcquired", "LeaseForwarded", "LeaseHandedOff"):
        assert metrics.names.count(name) == 1, name
    assert len(metrics.values["LeaseHoldMs"]) == 2
    assert len(metrics.values["LeaseWaitMs"]) == 1 and metrics.values["LeaseWaitMs"][0] >= 0


# -- handoff across invocations -----------------------------------------------------------------


def lambda_client_stub() -> tuple[Any, Stubber]:
    client = boto3.client(
        "lambda", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    return client, Stubber(client)


def test_invoke_handoff_payload_and_receiver(provider: BaseLeaseProvider) -> None:
    client, stub = lambda_client_stub()
    seen: list[tuple[int, int | None]] = []
    release = threading.Event()

    @lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(lambda_client=client, margin_ms=5_000),
    )
    def handler(event: dict[str, Any], context: Any) -> int:
        seen.append((event["n"], current_lease().token))
        if event["n"] == 0:
            release.wait(10)
        return int(event["n"])

    ctx = LambdaContext(timeout_ms=4_000)  # the deadline is inside the margin: hand off
    stub.add_response(
        "invoke",
        {"StatusCode": 202},
        {"FunctionName": ctx.invoked_function_arn, "InvocationType": "Event", "Payload": ANY},
    )
    payloads: list[dict[str, Any]] = []
    client.meta.events.register(
        "provide-client-params.lambda.Invoke",
        lambda params, **_: payloads.append(json.loads(params["Payload"])),
    )
    stub.activate()
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(r=handler({"k": "inv", "n": 0}, ctx)))
    thread.start()
    while not seen:
        time.sleep(0.01)
    assert handler({"k": "inv", "n": 1}, LambdaContext())["leaseguard"]["status"] == "forwarded"
    release.set()
    thread.join()
    stub.assert_no_pending_responses()
    assert result["r"] == 0 and [n for n, _ in seen] == [0]
    envelope = payloads[0][ENVELOPE_FIELD]
    assert envelope["key"] == "inv" and envelope["payload"] == {"k": "inv", "n": 1}
    state = provider.inspect_key("inv")
    assert state.owner == envelope["owner"] and state.token == envelope["token"]

    # The async invocation receives the envelope and runs the stored signal.
    assert handler(payloads[0], LambdaContext()) == 1
    assert [n for n, _ in seen] == [0, 1]
    assert seen[1][1] == envelope["token"]
    assert provider.get_lease_owner("inv") is None
    # A replay of the same envelope (Lambda retries async events) runs nothing.
    replay = handler(payloads[0], LambdaContext())
    assert replay["leaseguard"]["status"] == "rejected"
    assert len(seen) == 2


def test_forged_and_stale_envelopes_run_nothing_and_change_nothing(
    provider: BaseLeaseProvider,
) -> None:
    ran: list[Any] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL, handoff="inline")
    def handler(event: Any, context: Any) -> None:
        ran.append(event)

    provider.acquire_lease("f", "real-owner", TTL)
    provider.acquire_or_enqueue("f", Signal("queued", {"k": "f", "n": 1}), TTL)
    token = provider.inspect_key("f").token
    assert token is not None
    before = provider.inspect_key("f")
    forged = [
        Envelope("f", "real-owner", token, {"evil": True}).to_event(),  # own grant, claimed
        Envelope("f", "queued", token, {"evil": True}).to_event(),  # not the owner
        Envelope("f", "real-owner", token + 1, {"evil": True}).to_event(),  # wrong token
        Envelope("other-key", "real-owner", token, {}).to_event(),  # names another key
        {ENVELOPE_FIELD: {"version": 1, "key": "f", "owner": "real-owner", "token": "1"}},
        # above what any backend stores: answered "rejected", never an exception
        {ENVELOPE_FIELD: {"version": 1, "key": "f", "owner": "real-owner", "token": 2**63}},
        {ENVELOPE_FIELD: {"version": 9, "key": "f", "owner": "x", "token": 1}},
        {ENVELOPE_FIELD: {"version": 1, "key": "", "owner": "x", "token": 1}},
        {ENVELOPE_FIELD: "not an object"},
    ]
    for event in forged:
        result = handler(event, LambdaContext())
        assert result["leaseguard"]["status"] == "rejected", event
    assert ran == []
    after = provider.inspect_key("f")
    assert (after.owner, after.token, after.queued) == (before.owner, before.token, before.queued)


def test_sqs_handoff_sends_the_envelope_to_the_queue(provider: BaseLeaseProvider) -> None:
    client = boto3.client(
        "sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stub = Stubber(client)
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/handoff"
    stub.add_response("send_message", {"MessageId": "m1"}, {"QueueUrl": url, "MessageBody": ANY})
    stub.activate()
    recorder = Recorder()
    handler = lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig("sqs", queue_url=url, sqs_client=client),
    )(recorder)
    owner = hold_in_background(handler, {"k": "q", "n": 0}, recorder)
    handler({"k": "q", "n": 1}, LambdaContext())
    recorder.gate.set()
    owner.join()
    stub.assert_no_pending_responses()
    assert [s[0] for s in recorder.seen] == [0]
    assert provider.inspect_key("q").owner is not None  # granted to the queued signal


def test_failed_dispatch_leaves_the_grant_for_the_sweeper(provider: BaseLeaseProvider) -> None:
    client, stub = lambda_client_stub()
    stub.add_client_error("invoke", service_error_code="ServiceException", http_status_code=500)
    stub.activate()
    recorder = Recorder()
    ttl = short_ttl(provider)
    handler = lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=ttl,
        handoff=HandoffConfig("invoke", lambda_client=client),
    )(recorder)
    owner = hold_in_background(handler, {"k": "s", "n": 0}, recorder)
    handler({"k": "s", "n": 1}, LambdaContext())
    recorder.gate.set()
    owner.join()
    assert owner.result["r"]["statusCode"] == 200  # type: ignore[attr-defined]
    time.sleep(ttl * 1.5 / 1000)  # the undelivered grant expires
    adopted = provider.adopt_orphans(TTL, 10)
    assert [(k, s.payload) for k, s in adopted] == [("s", {"k": "s", "n": 1})]


# -- failures -----------------------------------------------------------------------------------


def test_own_failure_reraises_after_handing_off(provider: BaseLeaseProvider) -> None:
    order: list[int] = []
    started, release = threading.Event(), threading.Event()

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL, handoff="inline")
    def handler(event: dict[str, Any], context: Any) -> int:
        order.append(event["n"])
        if event["n"] == 0:
            started.set()
            release.wait(10)
            raise RuntimeError("first fails")
        return int(event["n"])

    errors: list[BaseException] = []

    def run_first() -> None:
        try:
            handler({"k": "e", "n": 0}, LambdaContext())
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_first)
    thread.start()
    assert started.wait(10)
    handler({"k": "e", "n": 1}, LambdaContext())
    release.set()
    thread.join()
    assert [str(e) for e in errors] == ["first fails"]
    assert order == [0, 1]  # the queued event still ran
    assert provider.get_lease_owner("e") is None


def test_failing_forwarded_signal_is_retried_then_dead_lettered_and_the_chain_goes_on(
    provider: BaseLeaseProvider,
) -> None:
    failures: list[tuple[str, str]] = []
    recorder_order: list[int] = []
    started, release = threading.Event(), threading.Event()

    @lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=TTL,
        on_signal_error=lambda s, e: failures.append((s.id, str(e))),
    )
    def handler(event: dict[str, Any], context: Any) -> int:
        recorder_order.append(event["n"])
        if event["n"] == 0:
            started.set()
            release.wait(10)
        if event["n"] == 1:
            raise ValueError("poison")
        return int(event["n"])

    thread = threading.Thread(target=handler, args=({"k": "p", "n": 0}, LambdaContext()))
    thread.start()
    assert started.wait(10)
    ctx1 = LambdaContext()
    handler({"k": "p", "n": 1}, ctx1)
    handler({"k": "p", "n": 2}, LambdaContext())
    release.set()
    thread.join()
    # Retried at the head of the queue (2 waits behind it), dead-lettered after 3 runs.
    assert recorder_order == [0, 1, 1, 1, 2]
    assert failures == [(ctx1.aws_request_id, "poison")] * 3
    state = provider.inspect_key("p")
    assert [(d.id, d.attempts, d.payload["n"]) for d in state.dead_letters] == [
        (ctx1.aws_request_id, 3, 1)
    ]
    assert "poison" in state.dead_letters[0].error
    assert state.owner is None and not state.queued and not state.in_flight


def test_signals_taken_by_a_run_that_raises_are_retried_not_dropped(
    provider: BaseLeaseProvider,
) -> None:
    """The README's drain pattern: follow-ups taken with take_signals() and then the handler
    raises. They go back to the head of the queue (the own event goes to the platform)."""
    handled: list[int] = []
    errors: list[str] = []
    started, release = threading.Event(), threading.Event()

    @lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=TTL,
        on_signal_error=lambda s, e: errors.append(s.payload["n"]),
    )
    def handler(event: dict[str, Any], context: Any) -> int:
        if event["n"] == 0:
            started.set()
            release.wait(10)
            taken = current_lease().take_signals(10)
            assert [s.payload["n"] for s in taken] == [1, 2]
            raise RuntimeError("crashed while handling the batch")
        handled.append(event["n"])
        return int(event["n"])

    outcome: list[BaseException] = []

    def first() -> None:
        try:
            handler({"k": "t", "n": 0}, LambdaContext())
        except RuntimeError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(10)
    handler({"k": "t", "n": 1}, LambdaContext())
    handler({"k": "t", "n": 2}, LambdaContext())
    release.set()
    thread.join()
    assert len(outcome) == 1  # the invocation's own event re-raises: the platform retries it
    assert errors == [1, 2]
    assert handled == [1, 2]  # retried inline, in order, after the failed run
    state = provider.inspect_key("t")
    assert state.owner is None and not state.queued and not state.dead_letters


def test_orphans_run_before_a_new_event(provider: BaseLeaseProvider) -> None:
    order: list[Any] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL)
    def handler(event: dict[str, Any], context: Any) -> Any:
        order.append(event["n"])
        return event["n"]

    # A 150 ms lease here once ran out on moto under load before the orphan was queued, which
    # then owned the key itself: the lease runs out only once the orphan waits behind it.
    provider.acquire_lease("o", "dead-owner", TTL)
    provider.acquire_or_enqueue("o", Signal("orphan", {"k": "o", "n": "orphan"}), TTL)
    let_leases_expire(provider, ("o", "dead-owner"))
    assert handler({"k": "o", "n": "new"}, LambdaContext()) == "new"
    assert order == ["orphan", "new"]


def test_async_handler(provider: BaseLeaseProvider) -> None:
    # moto answers in tens of ms, far more on a loaded machine: a longer TTL there keeps the
    # test about renewal, not about moto's latency.
    ttl = short_ttl(provider)
    started: list[asyncio.Event] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=ttl)
    async def handler(event: dict[str, Any], context: Any) -> tuple[str, bool]:
        started[0].set()
        await asyncio.sleep(ttl * 1.6 / 1000)  # longer than the TTL: renewal must keep it
        lease = current_lease()
        return lease.key, lease.lost

    async def main() -> list[Any]:
        started.append(asyncio.Event())
        first = asyncio.create_task(handler({"k": "async"}, LambdaContext()))
        # The guard's backend calls run off the event loop: wait until the first owns the key.
        await asyncio.wait_for(started[0].wait(), 10)
        second = await handler({"k": "async"}, LambdaContext())
        return [await first, second]

    first, second = asyncio.run(main())
    assert first == ("async", False)
    assert second["leaseguard"]["status"] == "forwarded"
    assert renew_threads() == []
    assert provider.get_lease_owner("async") is None  # the forwarded one ran inline, then freed


def test_fifo_sqs_handoff_groups_by_key_and_dedupes_per_grant() -> None:
    from leaseguard.handoff import SqsDispatcher

    client = boto3.client(
        "sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stub = Stubber(client)
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/handoff.fifo"
    sent: list[dict[str, Any]] = []
    client.meta.events.register(
        "provide-client-params.sqs.SendMessage", lambda params, **_: sent.append(dict(params))
    )
    for _ in range(3):
        stub.add_response("send_message", {"MessageId": "m"}, None)
    stub.activate()
    dispatcher = SqsDispatcher(url, client)
    dispatcher.dispatch(Envelope("thread:1" + "x" * 200, "a", 7, {}))
    dispatcher.dispatch(Envelope("thread:2", "b", 7, {}))
    dispatcher.dispatch(Envelope("thread:1" + "x" * 200, "c", 8, {}))
    groups = [p["MessageGroupId"] for p in sent]
    dedup = [p["MessageDeduplicationId"] for p in sent]
    assert groups[0] == groups[2] != groups[1] and all(len(g) <= 128 for g in groups)
    assert len(set(dedup)) == 3  # same token on two keys, or two tokens on one key: all distinct


def test_a_context_without_a_function_arn_hands_off_inline(provider: BaseLeaseProvider) -> None:
    """`leaseguard invoke` runs handlers locally with such a context: a near deadline must not
    make the guard call AWS."""
    recorder = Recorder()
    handler = lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, handoff=HandoffConfig(margin_ms=60_000)
    )(recorder)
    local = LambdaContext(timeout_ms=1_000, function_arn="")
    owner = threading.Thread(target=handler, args=({"k": "local", "n": 0}, local))
    recorder.gate.clear()
    owner.start()
    assert recorder.inside.wait(10)
    handler({"k": "local", "n": 1}, LambdaContext())
    recorder.gate.set()
    owner.join()
    assert [s[0] for s in recorder.seen] == [0, 1]  # ran inline, no Invoke attempted
    assert provider.get_lease_owner("local") is None


class _SlowReplies:
    """The provider's steps apply at once, but their replies arrive ``delay_s`` later (a slow
    network, a GC pause in the client): nothing else is wrapped."""

    def __init__(self, provider: BaseLeaseProvider, delay_s: float) -> None:
        self._provider, self._delay_s = provider, delay_s

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._provider, name)
        if name not in ("acquire_or_enqueue", "claim_signal"):
            return method

        def slow(*args: Any, **kwargs: Any) -> Any:
            reply = method(*args, **kwargs)
            time.sleep(self._delay_s)
            return reply

        return slow


def test_a_slow_acquire_reply_does_not_stretch_the_lease(provider: BaseLeaseProvider) -> None:
    """Bug 5: the handle counted its TTL from the reply, so a reply delayed by most of the TTL
    let the owner believe in a lease the backend had already expired (a second owner ran)."""
    ttl, delay = 1_500, 0.6
    seen: list[tuple[bool, int]] = []

    @lease_owned(lambda e: e["k"], provider=_SlowReplies(provider, delay), ttl_ms=ttl)
    def handler(event: Any, context: Any) -> None:
        lease = current_lease()
        seen.append((lease.lost, lease.remaining_ms))

    handler({"k": "slow"}, LambdaContext())
    ((lost, remaining),) = seen
    assert not lost
    assert remaining <= ttl - delay * 1000  # counted from the send, not the reply


def test_a_payload_with_a_lone_surrogate_round_trips(provider: BaseLeaseProvider) -> None:
    """Bug 8: legal JSON that is not UTF-8 ("\\ud800") raised UnicodeEncodeError."""
    provider.acquire_lease("sur", "owner", TTL)
    payload = {"text": "a\ud800b", "emoji": "\U0001f600"}
    provider.acquire_or_enqueue("sur", Signal("s1", payload), TTL)
    assert [s.payload for s in provider.inspect_key("sur").queued] == [payload]
    assert [s.payload for s in provider.take_signals("sur", "owner", 10)] == [payload]


class _TakeGivesUp(_SlowReplies):
    """``take_signals`` applies on the backend, then the client gives up (its retries timed
    out): the batch is in flight, and the handler only sees an exception."""

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._provider, name)
        if name != "take_signals":
            return method

        def gives_up(*args: Any, **kwargs: Any) -> Any:
            method(*args, **kwargs)
            raise LeaseBackendError("take_signals: read timed out (it was applied)")

        return gives_up


class _HandOffsSeen(_TakeGivesUp):
    """As :class:`_TakeGivesUp`, and records the signals ``transfer_to_next`` hands on."""

    def __init__(self, provider: BaseLeaseProvider, delay: float) -> None:
        super().__init__(provider, delay)
        self.handed: list[Signal] = []

    def __getattr__(self, name: str) -> Any:
        method = super().__getattr__(name)
        if name != "transfer_to_next":
            return method

        def recorded(*args: Any, **kwargs: Any) -> Any:
            nxt = method(*args, **kwargs)
            if nxt is not None:
                self.handed.append(nxt)
            return nxt

        return recorded


def test_a_take_that_applied_but_failed_does_not_complete_what_it_took(
    provider: BaseLeaseProvider,
) -> None:
    """Found by the model checker (mutant failed-take-completes): the handler swallows the
    error and succeeds, but the backend moved the batch into flight; completing the run as a
    success would mark signals done that no handler saw. The run's partial report (G8) names
    only what ran: the taken signal goes back to the head unrun, with no attempt charged to it
    (G5, invariant (l)), and runs next; the run's own success stands."""
    handled: list[int] = []
    started, release = threading.Event(), threading.Event()
    wrapped = _HandOffsSeen(provider, 0)

    @lease_owned(lambda e: e["k"], provider=wrapped, ttl_ms=TTL)
    def handler(event: dict[str, Any], context: Any) -> None:
        if event["n"] == 0:
            started.set()
            release.wait(10)
            with pytest.raises(LeaseBackendError):
                current_lease().take_signals(10)
            return  # swallowed: the user's handler "succeeds"
        handled.append(event["n"])

    failures: list[BaseException] = []

    def first() -> None:
        try:
            handler({"k": "g", "n": 0}, LambdaContext())
        except LeaseBackendError as exc:
            failures.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(10)
    handler({"k": "g", "n": 1}, LambdaContext())
    release.set()
    thread.join()
    assert handled == [1]  # back at the head, run inline: not lost
    assert [s.attempts for s in wrapped.handed] == [0]  # and not charged
    assert failures == []  # the run that swallowed the error succeeded
    state = provider.inspect_key("g")
    assert state.owner is None and not state.queued and not state.dead_letters
