"""The guard's batch drain (``drain_batch``), on every backend: what waits behind an owner runs
in order, once each, under the owner's grant, with one hand-off per batch; a failure inside a
batch retries only what failed and keeps the rest in place (docs/protocol.md, row G8)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

from leaseguard import (
    ConfigurationError,
    HandoffConfig,
    LeaseBackendError,
    RetryConfig,
    current_lease,
    lease_owned,
)
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.testing import LambdaContext
from leaseguard.types import Signal
from tests.test_deadlines import StubLambda

TTL = 5_000


class Handler:
    """Records (n, owner, token) of every run; ``gate`` holds the first run inside its lease;
    ``fail`` maps n to how many of its runs raise."""

    def __init__(
        self, fail: dict[int, int] | None = None, work_s: float = 0.0, slow: float = 0.0
    ) -> None:
        self.seen: list[tuple[int, str, int | None]] = []
        self.grants: list[str] = []  # the owner of the grant each run ran under
        self.errors: list[str] = []
        self.fail = dict(fail or {})
        self.work_s = work_s
        self.slow = slow  # the run of event 1 (the first one handed the key) takes this long
        self.gate, self.inside = threading.Event(), threading.Event()
        self.gate.set()

    def __call__(self, event: dict[str, Any], context: Any) -> str:
        lease = current_lease()
        self.seen.append((event["n"], lease.owner, lease.token))
        self.grants.append(lease.grant_owner)
        self.inside.set()
        self.gate.wait(10)
        time.sleep(self.slow if event["n"] == 1 and self.slow else self.work_s)
        if self.fail.get(event["n"], 0) > 0:
            self.fail[event["n"]] -= 1
            raise RuntimeError(f"run of {event['n']} failed")
        return "ok"


def queue_behind_owner(handler: Any, recorder: Handler, n: int, context: Any = None) -> Any:
    """The owner runs event 0 and waits on the gate while events 1..n are forwarded."""
    recorder.gate.clear()
    recorder.inside.clear()
    result: dict[str, Any] = {}

    def own() -> None:
        try:
            result["r"] = handler({"k": "d", "n": 0}, context or LambdaContext())
        except Exception as exc:  # the own event re-raises its failure
            result["e"] = exc

    thread = threading.Thread(target=own)
    thread.start()
    assert recorder.inside.wait(10)
    for i in range(1, n + 1):
        forwarded = handler({"k": "d", "n": i}, LambdaContext())
        assert forwarded["leaseguard"]["position"] == i
    return thread, result


def drain_behind_owner(
    provider: Any, handler_fn: Any, recorder: Handler, queued: int, **options: Any
) -> dict[str, Any]:
    """``handler_fn`` guarded with ``options`` (key ``k``, TTL unless given): event 0 owns the
    key while 1..``queued`` are forwarded, then it drains them. The owner's result."""
    handoff = HandoffConfig(drain_batch=options.pop("drain_batch", None))
    retries = RetryConfig(max_attempts=options.pop("max_attempts", None))
    guarded = lease_owned(
        lambda e: e["k"], provider=provider, handoff=handoff, retries=retries,
        **{"ttl_ms": TTL, **options},
    )  # fmt: skip
    thread, result = queue_behind_owner(guarded(handler_fn), recorder, queued)
    recorder.gate.set()
    thread.join()
    return result


def idle(provider: BaseLeaseProvider, key: str = "d") -> None:
    state = provider.inspect_key(key)
    assert (state.owner, state.queued, state.in_flight) == (None, (), ())


def test_a_drain_runs_the_queue_in_order_once_each_under_one_grant_per_batch(
    provider: BaseLeaseProvider,
) -> None:
    recorder = Handler()
    result = drain_behind_owner(provider, recorder, recorder, 7, drain_batch=3)
    assert result["r"] == "ok"
    assert [n for n, _, _ in recorder.seen] == list(range(8))
    # 0 had the key uncontended: it hands it to 1 (a new token), which drains 2-4 under its
    # grant; 5 is handed the key next and drains 6 and 7
    owners = recorder.grants
    tokens = [token for _, _, token in recorder.seen]
    assert owners[2:5] == [owners[1]] * 3 and owners[6:] == [owners[5]] * 2
    # each run's current_lease().owner names its own event (the dedupe pattern's key)
    assert len({owner for _, owner, _ in recorder.seen}) == 8
    assert tokens[1:5] == [tokens[1]] * 4 and tokens[5:] == [tokens[5]] * 3
    assert len(set(tokens)) == 3 and tokens == sorted(tokens)  # type: ignore[type-var]
    idle(provider)


def test_a_failure_in_a_batch_retries_that_signal_first_and_runs_nothing_twice(
    provider: BaseLeaseProvider,
) -> None:
    recorder = Handler(fail={2: 1})
    failed: list[int] = []
    result = drain_behind_owner(
        provider,
        recorder,
        recorder,
        5,
        drain_batch=5,
        on_signal_error=lambda signal, exc: failed.append(signal.payload["n"]),
    )
    assert result["r"] == "ok"
    # 2 failed once, went back to the head, ran again first; 3-5 kept their place
    assert [n for n, _, _ in recorder.seen] == [0, 1, 2, 2, 3, 4, 5]
    assert failed == [2]
    idle(provider)
    assert provider.inspect_key("d").dead_letters == ()


def test_a_batch_signal_at_its_last_attempt_is_dead_lettered_and_the_rest_run(
    provider: BaseLeaseProvider,
) -> None:
    recorder = Handler(fail={3: 5})
    drain_behind_owner(provider, recorder, recorder, 5, drain_batch=10, max_attempts=1)
    assert [n for n, _, _ in recorder.seen] == [0, 1, 2, 3, 4, 5]
    state = provider.inspect_key("d")
    assert [(d.payload["n"], d.attempts) for d in state.dead_letters] == [(3, 1)]
    assert "run of 3 failed" in state.dead_letters[0].error
    assert (state.owner, state.queued, state.in_flight) == (None, (), ())


class TakeSpy:
    """The real provider, with its ``take_signals`` calls counted; with ``lose_replies`` their
    replies are lost: the take applies, then the caller sees an error (a timeout after the
    write, as on a dropped connection)."""

    def __init__(self, provider: BaseLeaseProvider, *, lose_replies: bool = False) -> None:
        self.provider = provider
        self.lose_replies = lose_replies
        self.takes = 0
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)

    def take_signals(self, *args: Any, **kwargs: Any) -> list[Signal]:
        self.takes += 1
        taken = self.provider.take_signals(*args, **kwargs)
        if not self.lose_replies:
            return taken
        self.lost += len(taken)
        raise LeaseBackendError("the reply of take_signals was lost")


def test_what_a_take_moved_without_its_reply_goes_back_unrun(
    provider: BaseLeaseProvider,
) -> None:
    lossy = TakeSpy(provider, lose_replies=True)
    recorder = Handler()
    result = drain_behind_owner(lossy, recorder, recorder, 4, drain_batch=3)
    assert result["r"] == "ok"
    assert lossy.lost > 0  # takes did move signals the owner never saw
    # each went back unrun, with no attempt counted, and ran once, in order
    assert [n for n, _, _ in recorder.seen] == [0, 1, 2, 3, 4]
    idle(provider)
    assert provider.inspect_key("d").dead_letters == ()


def test_an_owner_that_was_not_handed_the_key_takes_nothing(provider: BaseLeaseProvider) -> None:
    counting = TakeSpy(provider)
    recorder = Handler()
    handler = lease_owned(
        lambda e: e["k"], provider=counting, ttl_ms=TTL, handoff=HandoffConfig(drain_batch=10)
    )(recorder)
    for n in range(3):  # uncontended: each acquires and releases, no round trip more
        assert handler({"k": "d", "n": n}, LambdaContext()) == "ok"
    assert counting.takes == 0
    drain_behind_owner(counting, recorder, recorder, 3, drain_batch=10)
    # 0 hands the key to 1, which takes 2 (reporting itself done), then 3 (reporting 2), then
    # finds nothing (reporting 3); the drain then hands off once
    assert counting.takes == 3
    assert [n for n, _, _ in recorder.seen] == [0, 1, 2, 0, 1, 2, 3]
    idle(provider)


def drain_with_renewals(
    provider: BaseLeaseProvider, recorder: Handler, *, every_ms: int, queued: int
) -> list[str]:
    """``queued`` events behind an owner, drained 10 at a time under a 3 s TTL renewed every
    ``every_ms``; the reasons of the leases lost on the way."""
    lost: list[str] = []
    drain_behind_owner(
        provider,
        recorder,
        recorder,
        queued,
        ttl_ms=3_000,
        renew_every_ms=every_ms,
        drain_batch=10,
        on_lost=lambda handle: lost.append(str(handle.lost_reason)),
    )
    return lost


def test_a_batch_keeps_its_lease_renewed_past_the_ttl(provider: BaseLeaseProvider) -> None:
    recorder = Handler(work_s=0.45)
    # 1 drains 2-8: 3.2 s under one grant of 3 s
    assert drain_with_renewals(provider, recorder, every_ms=500, queued=8) == []
    assert [n for n, _, _ in recorder.seen] == list(range(9))
    assert len({token for _, _, token in recorder.seen[1:]}) == 1  # 1 drained 2-8
    idle(provider)


@pytest.mark.parametrize("lease_backend", ["redis"], indirect=True)  # the renewer's own rule
def test_the_drain_does_not_put_off_the_owners_next_renewal(provider: BaseLeaseProvider) -> None:
    # 1 is handed the key; its renewal is due 2 s after that grant. Its run ends at 1.6 s
    # and its batch (2-4) follows. Following the same grant again must keep that due time:
    # put off to 3.6 s, the renewal would come after the 3 s TTL ran out.
    recorder = Handler(work_s=0.6, slow=1.6)
    assert drain_with_renewals(provider, recorder, every_ms=2_000, queued=4) == []
    assert [n for n, _, _ in recorder.seen] == list(range(5))
    idle(provider)


def test_a_drain_stops_before_the_deadline_and_hands_the_rest_off(
    provider: BaseLeaseProvider,
) -> None:
    stub = StubLambda()
    # 9 runs of 0.2 s cannot all fit in 2 s less a 0.6 s margin (which also covers a slow
    # backend's hand-off under load)
    recorder = Handler(work_s=0.2)
    handler = lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig("auto", drain_batch=10, margin_ms=600, lambda_client=stub),
    )(recorder)
    context = LambdaContext(timeout_ms=2_000)
    thread, result = queue_behind_owner(handler, recorder, 8, context)
    context.started_at = time.monotonic()  # its clock starts once the queue is full
    recorder.gate.set()
    thread.join()
    assert result["r"] == "ok"
    assert context.get_remaining_time_in_millis() > 0  # it returned before its deadline
    ran_inline = len(recorder.seen)
    assert 1 <= ran_inline < 9 and len(stub.invokes) == 1
    while stub.invokes:  # Lambda delivers each envelope to a new invocation
        payload = json.loads(stub.invokes.pop(0)["Payload"])
        handler(payload, LambdaContext())
    assert [n for n, _, _ in recorder.seen] == list(range(9))
    idle(provider)


@pytest.mark.parametrize("bad", [-1, 1_001, True, "3"])
def test_a_bad_drain_batch_is_a_configuration_error(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="drain_batch"):
        lease_owned("k", handoff=HandoffConfig(drain_batch=bad))(lambda event, context: None)


def test_drain_batch_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEGUARD_DRAIN_BATCH", "many")
    with pytest.raises(ConfigurationError, match="LEASEGUARD_DRAIN_BATCH"):
        lease_owned("k")(lambda event, context: None)
    monkeypatch.setenv("LEASEGUARD_DRAIN_BATCH", "4")
    guarded = lease_owned("k")(lambda event, context: None)
    assert guarded.__leaseguard__.options.drain_batch == 4  # type: ignore[attr-defined]


def test_an_async_handler_drains_the_same_way(provider: BaseLeaseProvider) -> None:
    seen: list[tuple[int, int | None]] = []
    inside, gate = threading.Event(), threading.Event()

    @lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, handoff=HandoffConfig(drain_batch=10)
    )
    async def handler(event: dict[str, Any], context: Any) -> str:
        seen.append((event["n"], current_lease().token))
        if event["n"] == 0:
            inside.set()
            await asyncio.to_thread(gate.wait, 10)
        if event["n"] == 3 and [n for n, _ in seen].count(3) == 1:
            raise RuntimeError("3 fails once")  # then 3 runs again, first
        return "ok"

    owner = threading.Thread(target=lambda: asyncio.run(handler({"k": "a", "n": 0}, None)))
    owner.start()
    assert inside.wait(10)
    for n in range(1, 5):
        forwarded = asyncio.run(handler({"k": "a", "n": n}, LambdaContext()))
        assert forwarded["leaseguard"]["position"] == n
    gate.set()
    owner.join()
    # 1 is handed the key and drains 2-4; 3 fails, so 4 goes back unrun behind it
    assert [n for n, _ in seen] == [0, 1, 2, 3, 3, 4]
    assert seen[1][1] == seen[2][1] == seen[3][1]
    idle(provider, "a")


def test_a_handler_that_takes_inside_a_batch_gets_the_batch_first(
    provider: BaseLeaseProvider,
) -> None:
    """Found by ``leaseguard simulate --drain-batch`` (FIFO violations): a batch run's handler
    that called take_signals got events queued after the rest of its batch, and ran them first.
    The batch's next signals are older than anything queued: the handler gets those."""
    order: list[int] = []
    recorder = Handler()

    def handler_that_takes(event: dict[str, Any], context: Any) -> str:
        result = recorder(event, context)
        order.append(event["n"])
        if event["n"] == 2:
            order.extend(s.payload["n"] for s in current_lease().take_signals(2))
        return result

    drain_behind_owner(provider, handler_that_takes, recorder, 7, drain_batch=3)
    # 1 is handed the key and takes 2-4; 2's handler takes 3 and 4 (not 5 and 6)
    assert order == list(range(8))
    assert [n for n, _, _ in recorder.seen] == [0, 1, 2, 5, 6, 7]
    idle(provider)
