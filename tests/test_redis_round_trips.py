"""One round trip per operation, proven by what the Redis server itself saw.

Each test runs on servers started for this module only (a standalone ``redis-server`` and a
3-master Cluster), so no other client adds to the counts. Two independent views of every call:

* ``MONITOR`` lists each command the server received, in order, and tags the commands a Lua
  script issued (``lua``), so the commands a client sent are exactly the untagged lines;
* ``INFO commandstats`` before and after counts every command the server executed, script
  calls included; minus the ``lua`` lines it must leave exactly one.

The probe's own traffic (``INFO``, the ``ECHO`` marker that ends a measurement) comes from a
separate connection and is left out of both. Scripts are warmed up first: the first call of a
script on a server is EVALSHA -> NOSCRIPT -> SCRIPT LOAD -> EVALSHA, which
``test_scripts_reload_after_script_flush`` checks separately.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import redis
from redis.cluster import RedisCluster

from leaseguard import LeaseLostError, Signal
from leaseguard.errors import QueueFull
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import RedisClusterServers, RedisServer

T = TypeVar("T")
TTL = 10_000
PROBE_COMMANDS = ("info", "echo")  # sent by the probe's own connection


def _command_name(line: str) -> str:
    words = line.split(" ", 2)
    name = words[0].lower()
    if name == "script" and len(words) > 1:
        return f"script {words[1].lower()}"
    return name


@dataclass
class Traffic:
    """What the servers saw during one measured call."""

    sent: list[list[str]]  # per node: the commands clients sent (MONITOR, non-Lua lines)
    from_scripts: int  # MONITOR lines issued by Lua scripts, all nodes
    executed: Counter[str] = field(default_factory=Counter)  # commandstats delta, all nodes

    @property
    def commands(self) -> list[str]:
        return [name for node in self.sent for name in node]

    @property
    def received(self) -> int:
        """Commands executed minus those scripts issued: what the clients sent."""
        return sum(self.executed.values()) - self.from_scripts


class _Node:
    def __init__(self, port: int) -> None:
        self.port = port
        self.control = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        self.address = str(self.control.client_info()["addr"])
        self._monitor_client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        self._monitor = self._monitor_client.monitor()
        self._monitor.__enter__()

    def stats(self) -> Counter[str]:
        info = self.control.info("commandstats")
        return Counter(
            {str(name).removeprefix("cmdstat_"): int(row["calls"]) for name, row in info.items()}
        )

    def drain(self) -> tuple[list[str], int]:
        """The commands other clients sent since the last drain, and how many lines came from
        Lua scripts, up to a marker this node's control connection sends now."""
        marker = f"leaseguard-probe-{uuid.uuid4().hex}"
        self.control.echo(marker)
        sent: list[str] = []
        from_scripts = 0
        while True:
            line = self._monitor.next_command()
            if line["client_type"] == "lua":
                from_scripts += 1
            elif f"{line['client_address']}:{line['client_port']}" == self.address:
                if marker in line["command"]:
                    return sent, from_scripts
            else:
                sent.append(_command_name(line["command"]))

    def close(self) -> None:
        self._monitor.__exit__()
        self._monitor_client.close()
        self.control.close()


def assert_one(traffic: Traffic, command: str = "evalsha") -> None:
    assert traffic.commands == [command]
    assert traffic.executed[command] == 1
    assert traffic.received == 1


class CommandWatch:
    """Counts what one server (or every node of a Cluster) receives during a call."""

    def __init__(self, ports: list[int]) -> None:
        self.nodes = [_Node(port) for port in ports]
        self.last = Traffic(sent=[], from_scripts=0)  # the latest measurement

    def forget(self) -> None:
        """Drop what was received so far (set-up traffic nobody measures)."""
        for node in self.nodes:
            node.drain()

    def measure(self, call: Callable[[], T]) -> tuple[T, Traffic]:
        """Run ``call`` and return its result and the traffic it caused. If it raises, the
        traffic is still collected (in ``last``) before the exception propagates."""
        self.forget()
        before = [node.stats() for node in self.nodes]
        try:
            result = call()
        finally:
            drained = [node.drain() for node in self.nodes]
            after = [node.stats() for node in self.nodes]
            executed: Counter[str] = Counter()
            for b, a in zip(before, after, strict=True):
                executed.update(a - b)
            for name in PROBE_COMMANDS:
                del executed[name]
            self.last = Traffic(
                sent=[sent for sent, _ in drained],
                from_scripts=sum(n for _, n in drained),
                executed=executed,
            )
        return result, self.last

    def one(self, call: Callable[[], T], command: str = "evalsha") -> T:
        """Run ``call`` and assert the servers received exactly one command, ``command``."""
        result, traffic = self.measure(call)
        assert_one(traffic, command)
        return result

    def close(self) -> None:
        for node in self.nodes:
            node.close()


@dataclass
class Rig:
    provider: RedisLeaseProvider
    watch: CommandWatch
    ports: list[int]

    def node_of(self, key: str) -> int:
        """Index in ``ports`` of the node that holds ``key``."""
        client = self.provider.client
        if not isinstance(client, RedisCluster):
            return 0
        return self.ports.index(client.get_node_from_key(self.provider.redis_keys(key)[0]).port)

    def keys_per_node(self, stem: str) -> list[str]:
        """One key per node, so every node sees every script."""
        found: dict[int, str] = {}
        n = 0
        while len(found) < len(self.ports):
            key = f"{stem}-{{{n}}} ü"
            found.setdefault(self.node_of(key), key)
            n += 1
        return [found[i] for i in range(len(self.ports))]


def exercise_every_script(provider: RedisLeaseProvider, key: str) -> None:
    """Runs every script (and both plain reads) once on ``key``'s server."""
    provider.acquire_lease(key, "warm-a", TTL)
    provider.renew_lease(key, "warm-a", TTL)
    provider.transfer_lease(key, "warm-a", "warm-b", TTL)
    provider.acquire_or_enqueue(key, Signal("warm-s1", {"n": 1}), TTL)
    provider.acquire_or_enqueue(key, Signal("warm-s2", {"n": 2}), TTL)
    provider.take_signals(key, "warm-b", 1)
    handed = provider.transfer_to_next(key, "warm-b", TTL, claim=False)
    assert handed is not None and handed.token is not None
    provider.claim_signal(key, handed.id, handed.token, TTL)
    provider.inspect_key(key)
    provider.get_lease_owner(key)
    provider.pending_signals(key)
    provider.release_lease(key, handed.id)
    provider.redrive(key)
    provider.dead_letter_keys(1)  # on Cluster, the slot-index scan on every primary


def _start_rig(servers: RedisServer | RedisClusterServers) -> Iterator[Rig]:
    client: redis.Redis | RedisCluster
    if isinstance(servers, RedisClusterServers):
        ports = [node.port for node in servers.nodes]
        client = RedisCluster.from_url(servers.url)
    else:
        ports = [servers.port]
        client = redis.Redis.from_url(servers.url)
    provider = RedisLeaseProvider(client, prefix="rt:")
    rig = Rig(provider, CommandWatch(ports), ports)
    try:
        for key in rig.keys_per_node("warm-up"):
            exercise_every_script(provider, key)
        yield rig
    finally:
        rig.watch.close()
        client.close()


@pytest.fixture(scope="module")
def standalone_rig() -> Iterator[Rig]:
    with RedisServer() as server:
        yield from _start_rig(server)


@pytest.fixture(scope="module")
def cluster_rig() -> Iterator[Rig]:
    with RedisClusterServers(3) as cluster:
        yield from _start_rig(cluster)


@pytest.fixture(params=["redis", "redis-cluster"])
def rig(request: pytest.FixtureRequest) -> Rig:
    name = "cluster_rig" if request.param == "redis-cluster" else "standalone_rig"
    rig: Rig = request.getfixturevalue(name)
    return rig


@pytest.fixture
def key() -> str:
    return f"thread {{{uuid.uuid4().hex[:8]}}} ü"


# -- the lease contract ---------------------------------------------------------------------------


def test_acquire_of_a_free_key(rig: Rig, key: str) -> None:
    result = rig.watch.one(lambda: rig.provider.acquire_lease(key, "a", TTL))
    assert result.acquired and result.owner == "a" and result.token


def test_refused_acquire_names_the_holder(rig: Rig, key: str) -> None:
    held = rig.provider.acquire_lease(key, "a", TTL)
    result = rig.watch.one(lambda: rig.provider.acquire_lease(key, "b", TTL))
    assert not result.acquired and (result.owner, result.token) == ("a", held.token)


def test_reacquire_by_the_owner(rig: Rig, key: str) -> None:
    held = rig.provider.acquire_lease(key, "a", TTL)
    result = rig.watch.one(lambda: rig.provider.acquire_lease(key, "a", TTL))
    assert result.acquired and result.token == held.token


def test_renew(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    assert rig.watch.one(lambda: rig.provider.renew_lease(key, "a", TTL)) is True
    assert rig.watch.one(lambda: rig.provider.renew_lease(key, "b", TTL)) is False


def test_release(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    rig.watch.one(lambda: rig.provider.release_lease(key, "b"))  # not the owner: inert
    assert rig.provider.get_lease_owner(key) == "a"
    rig.watch.one(lambda: rig.provider.release_lease(key, "a"))
    assert rig.provider.get_lease_owner(key) is None


def test_transfer(rig: Rig, key: str) -> None:
    held = rig.provider.acquire_lease(key, "a", TTL)
    assert rig.watch.one(lambda: rig.provider.transfer_lease(key, "a", "b", TTL)) is True
    assert rig.watch.one(lambda: rig.provider.transfer_lease(key, "a", "c", TTL)) is False
    after = rig.provider.inspect_key(key)
    assert after.owner == "b" and after.token is not None and held.token is not None
    assert after.token > held.token


def test_get_lease_owner_is_one_plain_read(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    assert rig.watch.one(lambda: rig.provider.get_lease_owner(key), "hget") == "a"


# -- the signal queue -----------------------------------------------------------------------------


def test_acquire_or_enqueue_on_a_free_key(rig: Rig, key: str) -> None:
    result = rig.watch.one(lambda: rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL))
    assert result.acquired and result.owner == "s1"


def test_acquire_or_enqueue_on_a_held_key(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    result = rig.watch.one(lambda: rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL))
    assert not result.acquired and (result.owner, result.position) == ("a", 1)


def test_take_signals(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    for n in (1, 2):
        rig.provider.acquire_or_enqueue(key, Signal(f"s{n}", {"n": n}), TTL)
    taken = rig.watch.one(lambda: rig.provider.take_signals(key, "a", 10))
    assert [s.id for s in taken] == ["s1", "s2"]
    with pytest.raises(LeaseLostError):
        rig.watch.measure(lambda: rig.provider.take_signals(key, "b", 10))
    assert_one(rig.watch.last)


def test_transfer_to_next_hands_off_or_releases(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    handed = rig.watch.one(lambda: rig.provider.transfer_to_next(key, "a", TTL))
    assert handed is not None and handed.id == "s1"
    assert rig.watch.one(lambda: rig.provider.transfer_to_next(key, "s1", TTL)) is None
    assert rig.provider.get_lease_owner(key) is None


def test_claim_signal(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    rig.provider.acquire_or_enqueue(key, Signal("s1", {"n": 1}), TTL)
    handed = rig.provider.transfer_to_next(key, "a", TTL, claim=False)
    assert handed is not None and handed.token is not None
    token = handed.token
    claimed = rig.watch.one(lambda: rig.provider.claim_signal(key, "s1", token, TTL))
    assert claimed is not None and claimed.payload == {"n": 1}
    assert rig.watch.one(lambda: rig.provider.claim_signal(key, "s1", token, TTL)) is None


def test_pending_signals_is_one_plain_read(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    assert rig.watch.one(lambda: rig.provider.pending_signals(key), "llen") == 1


def test_inspect_key(rig: Rig, key: str) -> None:
    rig.provider.acquire_lease(key, "a", TTL)
    rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    state = rig.watch.one(lambda: rig.provider.inspect_key(key))
    assert state.owner == "a" and [s.id for s in state.queued] == ["s1"]


def test_a_failure_report_is_one_round_trip(rig: Rig, key: str) -> None:
    """[G6]: retrying, dead-lettering and handing off after a failure is still one script."""
    held = rig.provider.acquire_lease(key, "a", TTL)
    for n in (1, 2, 3):
        rig.provider.acquire_or_enqueue(key, Signal(f"s{n}", n), TTL)
    rig.provider.take_signals(key, "a", 2, token=held.token)
    nxt = rig.watch.one(
        lambda: rig.provider.transfer_to_next(key, "a", TTL, token=held.token, error="boom")
    )
    assert nxt is not None and (nxt.id, nxt.attempts) == ("s1", 1)
    token = nxt.token
    handed = rig.watch.one(
        lambda: rig.provider.transfer_to_next(
            key, "s1", TTL, token=token, error="again", max_attempts=2, requeue_owner=False
        )
    )
    assert handed is not None and handed.id == "s2" and handed.attempts == 1
    state = rig.watch.one(lambda: rig.provider.inspect_key(key))
    assert [s.id for s in state.queued] == ["s3"]
    # s1's own signal reached max_attempts: dead-lettered even with requeue_owner=False
    assert [(d.id, d.attempts) for d in state.dead_letters] == [("s1", 2)]


def test_a_retry_resuming_its_attempts_is_one_round_trip(rig: Rig, key: str) -> None:
    """[G6] [Q1]: the owner's own failed count is kept in the done memory and read back by the
    same acquire_or_enqueue script that grants the retry."""
    held = rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    rig.watch.one(
        lambda: rig.provider.transfer_to_next(
            key, "s1", TTL, token=held.token, error="x", requeue_owner=False
        )
    )
    again = rig.watch.one(lambda: rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL))
    assert (again.acquired, again.owner, again.attempts) == (True, "s1", 1)


def test_dead_letters_are_read_in_the_same_round_trip(rig: Rig, key: str) -> None:
    held = rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    rig.provider.transfer_to_next(key, "s1", TTL, token=held.token, error="x", max_attempts=1)
    state = rig.watch.one(lambda: rig.provider.inspect_key(key))
    assert [(d.id, d.error) for d in state.dead_letters] == [("s1", "x")]


def test_a_duplicate_is_one_round_trip(rig: Rig, key: str) -> None:
    """[Q5]: the completed-id memory is read inside the acquire_or_enqueue script."""
    held = rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    rig.watch.one(lambda: rig.provider.transfer_to_next(key, "s1", TTL, token=held.token))
    again = rig.watch.one(lambda: rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL))
    assert not again.acquired and (again.owner, again.token, again.position) == (None, None, None)


def test_a_resend_recognised_by_the_done_memory_is_one_round_trip(rig: Rig, key: str) -> None:
    """[N4]: a resent transfer_to_next after a newcomer came and went answers None."""
    held = rig.provider.acquire_lease(key, "a", TTL)
    rig.provider.transfer_to_next(key, "a", TTL, token=held.token)
    rig.provider.acquire_lease(key, "b", TTL)
    rig.provider.release_lease(key, "b")
    resent = rig.watch.one(lambda: rig.provider.transfer_to_next(key, "a", TTL, token=held.token))
    assert resent is None


def test_a_refused_forward_is_one_round_trip(rig: Rig, key: str) -> None:
    """[Q8]: the bound is checked inside the acquire_or_enqueue script."""
    rig.provider.acquire_lease(key, "a", TTL)
    rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    with pytest.raises(QueueFull):
        rig.watch.measure(
            lambda: rig.provider.acquire_or_enqueue(key, Signal("s2", 2), TTL, max_queue=1)
        )
    assert_one(rig.watch.last)


def test_halting_and_queueing_behind_a_halt_are_one_round_trip_each(rig: Rig, key: str) -> None:
    """[G6] with on_poison="halt" and [N1]; then [Q9]."""
    held = rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    rig.provider.acquire_or_enqueue(key, Signal("s2", 2), TTL)
    released = rig.watch.one(
        lambda: rig.provider.transfer_to_next(
            key, "s1", TTL, token=held.token, error="x", max_attempts=1, on_poison="halt"
        )
    )
    assert released is None
    queued = rig.watch.one(lambda: rig.provider.acquire_or_enqueue(key, Signal("s3", 3), TTL))
    assert (queued.acquired, queued.owner, queued.position) == (False, None, 2)
    assert rig.watch.one(lambda: rig.provider.inspect_key(key)).halted


def test_claiming_an_expired_grant_again_is_one_round_trip(rig: Rig, key: str) -> None:
    """[C4]: the grant's token outlives its lease hash in the key's state hash."""
    held = rig.provider.acquire_lease(key, "a", TTL)
    rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    handed = rig.provider.transfer_to_next(key, "a", TTL, claim=False, token=held.token)
    assert handed is not None and handed.token is not None
    token = handed.token
    assert rig.provider.renew_lease(key, "s1", 1, token=token)
    time.sleep(0.02)
    again = rig.watch.one(lambda: rig.provider.claim_signal(key, "s1", token, TTL))
    assert again is not None and again.token is not None and again.token > token


def test_redrive_is_one_round_trip(rig: Rig, key: str) -> None:
    held = rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    rig.provider.transfer_to_next(key, "s1", TTL, token=held.token, error="x", max_attempts=1)
    assert rig.watch.one(lambda: rig.provider.redrive(key, ["s1"])) == 1
    assert rig.watch.one(lambda: rig.provider.redrive(key)) == 0


def test_dead_letter_keys_is_one_index_read(standalone_rig: Rig, key: str) -> None:
    """Standalone: one ZRANGE of the index (never a scan of the keyspace)."""
    rig = standalone_rig
    held = rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    rig.provider.transfer_to_next(key, "s1", TTL, token=held.token, error="x", max_attempts=1)
    assert key in rig.watch.one(lambda: rig.provider.dead_letter_keys(1000), "zrange")


def test_cluster_dead_letter_keys_reads_only_the_slot_indexes(cluster_rig: Rig, key: str) -> None:
    """Cluster: one script run per primary, which reads that primary's slot indexes (one ZRANGE
    per slot, 16,384 in all); no SCAN, nothing else."""
    rig = cluster_rig
    held = rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    rig.provider.transfer_to_next(key, "s1", TTL, token=held.token, error="x", max_attempts=1)
    found, traffic = rig.watch.measure(lambda: rig.provider.dead_letter_keys(1000))
    assert key in found
    assert traffic.sent == [["evalsha"]] * len(rig.ports)
    assert traffic.executed == Counter({"evalsha": len(rig.ports), "zrange": 16384})


def test_cluster_orphan_scan_is_one_script_run_per_primary(cluster_rig: Rig, key: str) -> None:
    rig = cluster_rig
    held = rig.provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)
    rig.provider.acquire_or_enqueue(key, Signal("s2", 2), TTL)
    assert rig.provider.renew_lease(key, "s1", 1, token=held.token)
    time.sleep(0.01)
    found, traffic = rig.watch.measure(lambda: rig.provider._orphan_candidates(1000))
    assert key in found
    assert traffic.sent == [["evalsha"]] * len(rig.ports)
    assert traffic.executed == Counter({"evalsha": len(rig.ports), "zrangebyscore": 16384})


# -- Cluster: the one command goes to the node that holds the key -------------------------------


def _lease_cycle(provider: RedisLeaseProvider, key: str) -> list[Callable[[], Any]]:
    return [
        lambda: provider.acquire_lease(key, "a", TTL),
        lambda: provider.acquire_lease(key, "b", TTL),
        lambda: provider.renew_lease(key, "a", TTL),
        lambda: provider.transfer_lease(key, "a", "b", TTL),
        lambda: provider.release_lease(key, "b"),
    ]


def test_each_call_lands_on_the_keys_node_only(cluster_rig: Rig) -> None:
    rig = cluster_rig
    for key in rig.keys_per_node(f"landing-{uuid.uuid4().hex[:6]}"):
        node = rig.node_of(key)
        for call in _lease_cycle(rig.provider, key):
            _, traffic = rig.watch.measure(call)
            expected = [["evalsha"] if i == node else [] for i in range(len(rig.ports))]
            assert traffic.sent == expected
            assert traffic.executed["evalsha"] == 1 and traffic.received == 1
        assert rig.provider.get_lease_owner(key) is None


# -- NOSCRIPT recovery ----------------------------------------------------------------------------


def test_scripts_reload_after_script_flush() -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        provider = RedisLeaseProvider(client, prefix="flush:")
        watch = CommandWatch([server.port])
        try:
            exercise_every_script(provider, "warm-up")
            watch.one(lambda: provider.acquire_lease("k1", "a", TTL))

            watch.nodes[0].control.script_flush()
            reload = ["evalsha", "script load", "evalsha"]

            result, traffic = watch.measure(lambda: provider.acquire_lease("k2", "a", TTL))
            assert traffic.commands == reload and traffic.received == 3
            assert result.acquired and result.owner == "a"
            _, traffic = watch.measure(lambda: provider.release_lease("k1", "a"))
            assert traffic.commands == reload
            assert provider.get_lease_owner("k1") is None

            # Loaded again: back to one command per call, with the state intact.
            refused = watch.one(lambda: provider.acquire_lease("k2", "b", TTL))
            assert not refused.acquired and refused.owner == "a"
            assert watch.one(lambda: provider.release_lease("k2", "a")) is None
            assert watch.one(lambda: provider.acquire_lease("k2", "b", TTL)).acquired
        finally:
            watch.close()
            client.close()


def test_cluster_scripts_reload_after_script_flush(cluster_rig: Rig) -> None:
    rig = cluster_rig
    key = rig.keys_per_node(f"flush-{uuid.uuid4().hex[:6]}")[1]
    for node in rig.watch.nodes:
        node.control.script_flush()

    result, traffic = rig.watch.measure(lambda: rig.provider.acquire_lease(key, "a", TTL))
    assert result.acquired
    # redis-py sends SCRIPT LOAD to every primary, so one NOSCRIPT reloads the whole cluster.
    assert traffic.executed["evalsha"] == 2
    assert traffic.executed["script|load"] + traffic.executed["script"] == len(rig.ports)
    assert traffic.sent[1] == ["evalsha", "script load", "evalsha"]
    assert all(sent == ["script load"] for i, sent in enumerate(traffic.sent) if i != 1)

    # Reload every script again (on every node) for the tests that follow.
    for warm_key in rig.keys_per_node("rewarm"):
        exercise_every_script(rig.provider, warm_key)
    rig.watch.one(lambda: rig.provider.acquire_lease(key, "b", TTL))
