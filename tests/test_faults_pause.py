"""Fault: an owner process is paused (SIGSTOP) past its TTL and resumed (SIGCONT).

This is the stale-owner scenario fencing exists for, with a real process, a real server and
the real ``@lease_owned``. The owner checks its lease, is frozen with every thread (its renewer
too) at the point where it is about to write, and stays frozen until its lease expired and a
new invocation took the key over. Then it resumes and writes. The test proves:

* the new owner got a **higher token** (it runs the paused owner's event again first: the
  paused process might have been dead, so its event is re-delivered);
* the stale owner **sees ``lost``** (flag, ``on_lost``, ``LeaseLost`` metric, an error log);
* its **fenced downstream write is refused** by a real store (a Redis key updated by a Lua
  compare-and-set, or a DynamoDB conditional update, the README's pattern);
* it **does not hand off**: the new owner, its token and the queue behind it are exactly as they
  were before the stale owner resumed, and the new owner then runs every queued event.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import uuid
from typing import Any

import pytest

from leaseguard import current_lease, lease_owned
from leaseguard.config import ProviderConfig
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.testing import LambdaContext, RedisClusterServers

from .faults import CountingMetrics, Fence, ListLogger

# 2 s: at 1 s a forked owner on a loaded 2-core run lost its lease before it reached its first
# check (its renewal came too late), which is not the pause this test is about.
TTL_MS = 2_000
SKEW_MS = 200  # DynamoDB's takeover margin in this test (callers share one clock)
_FORK = mp.get_context("fork")


@pytest.fixture(params=["redis", "redis-cluster", "dynamodb"])
def setup(request: pytest.FixtureRequest) -> tuple[ProviderConfig, Fence]:
    """A provider configuration and a fenced store on the same kind of backend."""
    prefix = f"pause{uuid.uuid4().hex[:8]}:"
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        return ProviderConfig(backend="redis", redis_url=url, key_prefix=prefix), Fence(url)
    if request.param == "redis-cluster":
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        config = ProviderConfig(
            backend="redis", redis_url=cluster.url, redis_cluster=True, key_prefix=prefix
        )
        return config, Fence(cluster.url, cluster=True)
    endpoint = request.getfixturevalue("dynamodb_endpoint")
    table = f"pause-{uuid.uuid4().hex[:8]}"
    DynamoDBLeaseProvider(table, endpoint_url=endpoint, region_name="us-east-1").create_table()
    config = ProviderConfig(
        backend="dynamodb",
        table_name=table,
        dynamodb_endpoint=endpoint,
        region_name="us-east-1",
        clock_skew_ms=SKEW_MS,
    )
    return config, Fence(table=f"fence-{table}", endpoint=endpoint).create()


def _paused_owner(config: ProviderConfig, fence: Fence, key: str, conn: Any) -> None:
    """The first owner, in its own process. It tells the test when it is inside the handler,
    then waits for "go"; the test freezes the whole process while it waits."""
    provider = config.build()
    logger, metrics = ListLogger(), CountingMetrics()
    lost: list[str | None] = []
    runs: list[str] = []

    @lease_owned(
        lambda e: e["key"],
        provider=provider,
        ttl_ms=TTL_MS,
        handoff="inline",
        on_lost=lambda handle: lost.append(handle.lost_reason),
        logger=logger,
        metrics=metrics,
    )
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        lease = current_lease()
        runs.append(event["n"])
        lease.check()  # the lease is valid: the next step is the write
        if event["n"] == "first":
            conn.send(("inside", lease.owner, lease.token))
            conn.recv()  # SIGSTOP lands here; after SIGCONT the test says "go"
        wrote = fence.write(lease.key, lease.token or 0, f"{event['n']}@{lease.token}")
        return {"wrote": wrote, "lost": lease.lost, "token": lease.token}

    try:
        result = handler({"key": key, "n": "first"}, LambdaContext(aws_request_id="first"))
        conn.send(("done", result, runs, lost, logger.messages(logging.WARNING), metrics.names))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Gate:
    """Holds the new owner inside its handler while it runs a given event."""

    def __init__(self, hold: str) -> None:
        self.hold = hold
        self.inside = threading.Event()
        self.release = threading.Event()


def _receive(conn: Any, timeout: float = 30) -> Any:
    assert conn.poll(timeout), "the owner process did not answer"
    message = conn.recv()
    assert message[0] != "error", message
    return message


def test_paused_owner_is_fenced_sees_lost_and_does_not_hand_off(
    setup: tuple[ProviderConfig, Fence],
) -> None:
    config, fence = setup
    key = f"thread-{uuid.uuid4().hex[:6]}"
    parent, child = _FORK.Pipe()
    owner = _FORK.Process(target=_paused_owner, args=(config, fence, key, child), daemon=True)
    owner.start()
    try:
        _, first_owner, first_token = _receive(parent)
        assert first_owner == "first" and first_token is not None

        os.kill(owner.pid, signal.SIGSTOP)  # a GC pause, a frozen VM: every thread stops
        try:
            time.sleep((TTL_MS + SKEW_MS + 500) / 1000)  # its lease runs out meanwhile

            # A new event for the key arrives while the first owner is frozen.
            provider = config.build()
            gate = Gate(hold="first")
            runs: list[tuple[str, str, int]] = []
            writes: list[bool] = []

            @lease_owned(lambda e: e["key"], provider=provider, ttl_ms=TTL_MS, handoff="inline")
            def handler(event: dict[str, Any], context: Any) -> str:
                lease = current_lease()
                assert lease.token is not None
                runs.append((event["n"], lease.owner, lease.token))
                writes.append(fence.write(lease.key, lease.token, f"{event['n']}@{lease.token}"))
                if event["n"] == gate.hold:
                    gate.inside.set()
                    assert gate.release.wait(30)
                return str(event["n"])

            done: dict[str, Any] = {}
            second = threading.Thread(
                target=lambda: done.update(
                    r=handler({"key": key, "n": "second"}, LambdaContext(aws_request_id="second"))
                )
            )
            second.start()
            assert gate.inside.wait(30)
            # The paused owner's event is delivered again first, under a higher token.
            assert runs == [("first", "first", runs[0][2])]
            new_token = runs[0][2]
            assert new_token > first_token
            assert writes == [True]
            forwarded = handler({"key": key, "n": "third"}, LambdaContext(aws_request_id="third"))
            assert forwarded["leaseguard"]["status"] == "forwarded"
            before = provider.inspect_key(key)
            assert (before.owner, before.token) == ("first", new_token)
            assert [s.id for s in before.queued] == ["second", "third"]
        finally:
            os.kill(owner.pid, signal.SIGCONT)

        parent.send("go")  # the stale owner wakes up and carries on where it stopped
        _, result, stale_runs, lost, warnings, metrics = _receive(parent)
        owner.join(30)

        assert result == {"wrote": False, "lost": True, "token": first_token}  # fenced off
        assert stale_runs == ["first"]  # it ran nothing else: no hand-off to itself
        assert len(lost) == 1  # on_lost ran once
        assert "LeaseLost" in metrics and "LeaseHandedOff" not in metrics
        assert any("not handing off" in line for line in warnings), warnings
        after = provider.inspect_key(key)  # nothing moved while the stale owner finished
        assert (after.owner, after.token, after.queued, after.in_flight) == (
            before.owner,
            before.token,
            before.queued,
            before.in_flight,
        )
        assert fence.read(key) == (new_token, f"first@{new_token}")

        gate.release.set()
        second.join(30)
        assert done["r"] == "second"
        assert [n for n, _, _ in runs] == ["first", "second", "third"]
        tokens = [t for _, _, t in runs]
        assert tokens == sorted(set(tokens))  # every grant a higher token
        assert writes == [True, True, True]
        assert fence.read(key) == (tokens[-1], f"third@{tokens[-1]}")
        final = provider.inspect_key(key)
        assert (final.owner, final.queued, final.in_flight) == (None, (), ())
    finally:
        if owner.is_alive():
            os.kill(owner.pid, signal.SIGCONT)
            owner.kill()
            owner.join()
