"""The SAM app end to end in Lambda containers: template.yaml and functions/ as built by
``sam build``, served by ``sam local start-api`` and ``start-lambda``, on each backend."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conftest import App, record
from harness import BATCH_WORKER, LEASE_TTL_MS, SWEEPER, reports

from leaseguard.handoff import Envelope, InvokeDispatcher
from leaseguard.types import Signal

# How old the owner's run is when it finishes its last message: with the functions' 30 s
# timeout and the guard's 3 s handoff margin, it then has less time left than its run took, so
# the next queued message must go to a new invocation (the guard's HandoffPolicy).
DEADLINE_PRESSURE_S = 18


def forwarded(reply: tuple[int, dict[str, object]]) -> dict[str, object]:
    """The guard's 202 body for a message forwarded to the owner."""
    status, body = reply
    assert status == 202, reply
    info = body["leaseguard"]
    assert isinstance(info, dict) and info["status"] == "forwarded", body
    return info


def test_concurrent_messages_have_one_owner_and_run_once_in_arrival_order(app: App) -> None:
    thread = app.thread("burst")
    first = f"{thread} first"
    hold = app.gate.hold(first) if app.gate else None
    assert hold is not None
    with ThreadPoolExecutor(8) as pool:
        owner = pool.submit(app.post, thread, {"text": first})
        hold.wait_arrived()  # the owner is inside its handler, holding the lease
        waves: list[list[str]] = [
            [f"{thread} a{i}" for i in range(3)],
            [f"{thread} b{i}" for i in range(2)],
        ]
        positions: dict[str, int] = {}
        for wave in waves:  # each wave's requests at once; the second after the first's replies
            replies = list(pool.map(lambda text: app.post(thread, {"text": text}), wave))
            for text, reply in zip(wave, replies, strict=True):
                info = forwarded(reply)
                assert info["holder"], info
                positions[text] = int(str(info["position"]))
        hold.release()
        status, body = owner.result(timeout=120)
    assert status == 200, body
    assert body["appended"] == 6, body
    log = app.messages(thread)
    texts = [m.text for m in log]
    assert texts[0] == first
    # Once each, and in the order they reached the queue: the positions the 202s reported,
    # and every message of the first wave before any of the second.
    assert sorted(texts) == sorted([first, *waves[0], *waves[1]])
    assert texts[1:] == sorted(positions, key=positions.__getitem__)
    assert set(texts[1:4]) == set(waves[0])
    assert len({m.id for m in log}) == len(log)
    tokens = [m.token for m in log]
    assert tokens == sorted(tokens) and tokens[0] >= 1, tokens
    assert tokens[0] == body["token"]


def test_handoff_goes_by_invoke_to_start_lambda_and_runs_in_a_new_container(app: App) -> None:
    thread = app.thread("handoff")
    first = f"{thread} first"
    assert app.gate is not None
    hold = app.gate.hold(first)
    provider = app.provider()
    queued = [f"{thread} q{i:03d}" for i in range(102)]
    # The owner's 100th message (its last: the worker runs at most MAX_MESSAGES_PER_RUN = 100
    # per invocation) is held until the run is DEADLINE_PRESSURE_S old, however fast the
    # backend drained the rest.
    last_inline = app.gate.hold(queued[97])
    with ThreadPoolExecutor(2) as pool:
        owner = pool.submit(app.post, thread, {"text": first})
        hold.wait_arrived()
        started = time.monotonic()
        # 102 queued behind the owner leave some for the next owner. They are forwarded the
        # way a forwarding invocation does it (acquire_or_enqueue), from here: 102 containers
        # would take minutes. One goes through start-api as well.
        forwarded(app.post(thread, {"text": f"{thread} via-api"}))
        for text in queued:
            result = provider.acquire_or_enqueue(
                thread, Signal(uuid.uuid4().hex, {"threadId": thread, "text": text}), LEASE_TTL_MS
            )
            assert not result.acquired, result
        hold.release()
        last_inline.wait_arrived()
        time.sleep(max(0.0, started + DEADLINE_PRESSURE_S - time.monotonic()))
        last_inline.release()
        status, body = owner.result(timeout=120)
    assert status == 200, body
    assert body["appended"] == 100, body
    expected = [first, f"{thread} via-api", *queued]
    log = app.wait_for_messages(thread, len(expected))
    assert [m.text for m in log] == expected
    first_token = log[0].token
    assert {m.token for m in log[:100]} == {first_token}
    handed = log[100:]
    assert handed and all(m.token > first_token for m in handed), [m.token for m in log]
    # The next owner ran in an invocation of its own, sent by Invoke to start-lambda: its
    # container logged its run there, with the new token.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lambda_log = next(p for p in app.processes if p.log.name == "sam-lambda.log").text()
        runs = [
            json.loads(line[line.index("{") :])
            for line in lambda_log.splitlines()
            if '"thread updated"' in line and thread in line
        ]
        if runs:
            break
        time.sleep(0.5)
    assert [run["token"] for run in runs] == [handed[0].token], runs
    assert runs[0]["appended"] == len(handed)


def test_a_failing_forwarded_message_is_retried_dead_lettered_and_redriven(app: App) -> None:
    thread = app.thread("poison")
    first, poison = f"{thread} first", f"{thread} poison"
    assert app.gate is not None
    hold = app.gate.hold(first)
    with app.gate.failing_appends(poison), ThreadPoolExecutor(2) as pool:
        owner = pool.submit(app.post, thread, {"text": first})
        hold.wait_arrived()
        signal_id = str(forwarded(app.post(thread, {"text": poison}))["signal_id"])
        hold.release()
        status, body = owner.result(timeout=120)
        assert status in (200, 502), body  # the failure is the owner run's to report
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            dead = {d.id: d for d in app.provider().inspect_key(thread).dead_letters}
            if signal_id in dead:
                break
            time.sleep(0.5)
    assert signal_id in dead, dead
    assert dead[signal_id].attempts == 3, dead[signal_id]  # LEASEGUARD_MAX_ATTEMPTS' default
    assert "ValidationException" in dead[signal_id].error
    assert [m.text for m in app.messages(thread)] == [first]
    listing = app.cli("dead-letters")
    assert any(line.split()[-1] == thread for line in listing.splitlines()[1:]), listing
    # The append works again; redrive puts the dead letters back, the sweeper runs them.
    out = app.cli("redrive", thread)
    assert out.startswith("redrove "), out
    assert not app.provider().inspect_key(thread).dead_letters
    log = sweep_until_appended(app, thread, 2)
    assert [m.text for m in log] == [first, poison]
    assert log[1].token > log[0].token
    assert thread not in app.cli("dead-letters")


def sweep_until_appended(app: App, thread: str, count: int, timeout_s: float = 150) -> list[Any]:
    """Invoke the sweeper function on start-lambda, as its schedule does, until ``thread``'s
    log holds ``count`` messages; the log. A pass that finds the thread orphaned dispatches it;
    a grant whose envelope was not claimed before its lease ran out is orphaned again and the
    next pass sends it again, so the check is that the messages run, not how soon."""
    client = app.lambda_client()
    deadline = time.monotonic() + timeout_s
    dispatched: list[object] = []
    while True:
        response = client.invoke(FunctionName=SWEEPER, Payload=b"{}")
        result = json.loads(response["Payload"].read())
        assert "FunctionError" not in response, result
        if thread in result["keys"]:
            dispatched.append(result)
        log = app.wait_for_messages(thread, count, timeout_s=20 if dispatched else 1)
        if len(log) >= count:
            assert dispatched, "the messages ran without the sweeper"
            return log
        assert time.monotonic() < deadline, f"{thread}: {log} after the sweeps {dispatched}"


def test_an_owner_container_killed_mid_run_is_adopted_by_the_sweeper(app: App) -> None:
    thread = app.thread("killed")
    first, follower = f"{thread} first", f"{thread} follower"
    assert app.gate is not None
    hold = app.gate.hold(first)
    with ThreadPoolExecutor(2) as pool:
        owner = pool.submit(app.post, thread, {"text": first})
        peer = hold.wait_arrived()
        forwarded(app.post(thread, {"text": follower}))
        dead_token = app.provider().inspect_key(thread).token
        container = container_at(peer)
        subprocess.run(["docker", "kill", container], check=True, capture_output=True)
        hold.drop()  # its append never reaches the store
        status, _ = owner.result(timeout=120)
    assert status >= 500
    assert app.messages(thread) == []
    log = sweep_until_appended(app, thread, 2)
    assert [m.text for m in log] == [first, follower]
    assert dead_token is not None and all(m.token > dead_token for m in log)


def container_at(address: str) -> str:
    """The id of the running container with this address on the bridge."""
    ids = subprocess.run(
        ["docker", "ps", "-q"], check=True, capture_output=True, text=True
    ).stdout.split()
    for container in ids:
        ip = subprocess.run(
            [
                "docker",
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                container,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        if address in ip:
            return container
    raise AssertionError(f"no running container has address {address}")


def test_an_sqs_batch_runs_through_handle_envelopes_and_its_handoff_by_invoke(app: App) -> None:
    """A batch from ``sam local generate-event sqs receive-message`` through the SQS-triggered
    batch worker (``process_partial_response`` under ``@handle_envelopes``), in a container:
    a record whose thread is owned elsewhere is queued for that owner, one whose append fails
    is the batch's only item failure, the rest are appended. Then the owner hands its queue on
    by an async Invoke of the batch worker with a handoff envelope, as a guarded owner does:
    ``@handle_envelopes`` turns it into a batch the processor accepts, and the queued records
    run in a new container, in order, under the grant's token."""
    busy, free, poison = app.thread("sqs-busy"), app.thread("sqs-free"), app.thread("sqs-poison")
    sent = [(busy, "b1"), (free, "f1"), (busy, "b2"), (poison, "p1"), (free, "f2")]
    records = []
    for thread, text in sent:
        body = json.dumps({"threadId": thread, "text": f"{thread} {text}"})
        # SAM puts --body into its JSON template as it is: escaped here as a JSON string's
        # inside, so the record's body is the JSON above.
        inside = json.dumps(body)[1:-1]
        (record_event,) = app.generate_event("sqs", "receive-message", "--body", inside)["Records"]
        assert record_event["body"] == body, record_event
        # SAM's sample has one fixed messageId; SQS gives each message its own.
        records.append({**record_event, "messageId": str(uuid.uuid4())})
    ids = [r["messageId"] for r in records]
    assert len(set(ids)) == len(ids), ids
    # The busy thread's owner, here, as another invocation would be (the TTL long enough that
    # it outlasts the batch's container start; the owner renews nothing).
    provider = app.provider()
    holder = Signal(uuid.uuid4().hex, {"threadId": busy, "text": f"{busy} holder"})
    held = provider.acquire_or_enqueue(busy, holder, 120_000)
    assert held.acquired and held.token is not None, held
    assert app.gate is not None
    with app.gate.failing_appends(f"{poison} p1"):
        result, output, wall_s = app.invoke(BATCH_WORKER, {"Records": records}, "sqs-batch")
    assert result == {"batchItemFailures": [{"itemIdentifier": ids[3]}]}, result
    free_log = app.messages(free)
    assert [(m.id, m.text) for m in free_log] == [(ids[1], f"{free} f1"), (ids[4], f"{free} f2")]
    assert free_log[0].token < free_log[1].token  # two grants, one per record
    assert app.messages(poison) == [] and app.messages(busy) == []
    # The failed record is SQS's to deliver again: nothing of it stays with the lease backend.
    poisoned = provider.inspect_key(poison)
    assert poisoned.owner is None and not poisoned.queued and not poisoned.dead_letters, poisoned
    queued = provider.inspect_key(busy)
    assert queued.owner == holder.id and [s.id for s in queued.queued] == [ids[0], ids[2]]
    report = reports(output)
    record(
        {
            "what": "an SQS batch of 5 records through the batch worker (sam local invoke)",
            "backend": app.backend,
            "first_duration_ms": report[-1][2] if report else None,
            "wall_s_with_container_start": round(wall_s, 1),
        }
    )
    # The owner is done and hands the lease to the oldest queued record, unclaimed, and sends
    # the envelope by Invoke to start-lambda (what the guard's InvokeDispatcher does).
    granted = provider.transfer_to_next(busy, holder.id, 30_000, claim=False, token=held.token)
    assert granted is not None and granted.id == ids[0] and granted.token is not None
    envelope = Envelope(busy, granted.id, granted.token, granted.payload)
    InvokeDispatcher(BATCH_WORKER, app.lambda_client()).dispatch(envelope)
    log = app.wait_for_messages(busy, 2)
    assert [(m.id, m.text) for m in log] == [(ids[0], f"{busy} b1"), (ids[2], f"{busy} b2")]
    assert log[0].token == granted.token and log[1].token >= granted.token > held.token
    # It ran in a container of start-lambda's, which logged it; and the key is free again.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lambda_log = next(p for p in app.processes if p.log.name == "sam-lambda.log").text()
        runs = [line for line in lambda_log.splitlines() if "from SQS" in line and busy in line]
        if len(runs) == 2 and provider.inspect_key(busy).owner is None:
            break
        time.sleep(0.5)
    assert len(runs) == 2, runs
    assert provider.inspect_key(busy).owner is None


def test_the_emulator_reports_each_run_and_the_cold_start_is_recorded(app: App) -> None:
    runs = reports(app.sam_logs())
    assert runs, "no REPORT line from the emulator"
    record(
        {
            "what": "runs reported by the emulator (start-api and start-lambda)",
            "backend": app.backend,
            "runs": len(runs),
            "init_duration_ms": sorted({r[1] for r in runs if r[1] is not None}),
            "max_duration_ms": max(r[2] for r in runs),
        }
    )
