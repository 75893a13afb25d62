"""Redis with replicas: what ``RedisLeaseProvider(..., replicas=N)`` prevents, what it cannot,
and what it costs (one round trip per step), on real primaries and replicas.

Every test starts its own servers (``RedisReplicatedServers``, a Cluster with one replica):
they promote replicas and kill primaries. A replica's link is dropped by promoting it
(``REPLICAOF NO ONE``: it keeps what it had and takes nothing more, the finding's "replica whose
link dropped"), or the replica is paused (SIGSTOP: the primary still lists it as online, but it
acknowledges nothing). A failover is the primary killed with SIGKILL and a provider pointed at
the promoted replica.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis
from redis.cluster import RedisCluster

from leaseguard import Signal, lease_owned
from leaseguard.config import ProviderConfig
from leaseguard.errors import (
    ConfigurationError,
    InvalidLeaseArgument,
    LeaseBackendError,
    NotReplicated,
)
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import (
    LambdaContext,
    RedisClusterWithReplicas,
    RedisReplica,
    RedisReplicatedServers,
    RedisServer,
)

from .test_guard import http_event
from .test_redis_round_trips import exercise_every_script

T = TypeVar("T")
TTL = 30_000
WAIT_MS = 100  # long enough for a replica on loopback, short enough to fail quickly


@pytest.fixture
def pair() -> Iterator[RedisReplicatedServers]:
    with RedisReplicatedServers(1) as servers:
        yield servers


@pytest.fixture
def clients() -> Iterator[Callable[[RedisServer], redis.Redis]]:
    made: list[redis.Redis] = []

    def client_of(server: RedisServer) -> redis.Redis:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        made.append(client)
        return client

    yield client_of
    for client in made:
        client.close()


def provider_on(client: redis.Redis | RedisCluster, replicas: int = 1) -> RedisLeaseProvider:
    return RedisLeaseProvider(client, prefix="rp:", replicas=replicas, replica_timeout_ms=WAIT_MS)


def fail_over(servers: RedisReplicatedServers, replica: int = 0) -> RedisReplica:
    """The primary dies (SIGKILL: nothing more leaves it) and the replica is promoted."""
    servers.primary.stop(9)
    promoted = servers.replicas[replica]
    promoted.promote()
    return promoted


_probes: dict[int, redis.Redis] = {}


def commandstats(server: RedisServer) -> Counter[str]:
    """Calls per command the server executed, minus this probe's own ``INFO``: one kept
    connection per server, so the probe adds no ``HELLO`` after its first call."""
    probe = _probes.get(server.port)
    if probe is None:
        probe = redis.Redis(port=server.port, single_connection_client=True)
        _probes[server.port] = probe
        probe.ping()
    info = probe.info("commandstats")
    calls = Counter(
        {str(name).removeprefix("cmdstat_"): int(r["calls"]) for name, r in info.items()}
    )
    del calls["info"]
    return calls


# -- the arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"replicas": -1},
        {"replicas": 101},
        {"replicas": True},
        {"replicas": "1"},
        {"replicas": 1, "replica_timeout_ms": 0},
        {"replicas": 1, "replica_timeout_ms": 60_001},
        {"replicas": 1, "replica_timeout_ms": 1.5},
        {"replicas": 1, "replica_timeout_ms": 2_000},  # not below the 2 s socket timeout
    ],
)
def test_bad_replication_arguments_are_refused_before_any_io(
    pair: RedisReplicatedServers, options: dict[str, Any]
) -> None:
    before = commandstats(pair.primary)
    with pytest.raises(InvalidLeaseArgument):
        RedisLeaseProvider.from_url(pair.url, **options)
    client = redis.Redis.from_url(pair.url, socket_timeout=2)
    with pytest.raises(InvalidLeaseArgument):
        RedisLeaseProvider(client, **options)
    client.close()
    assert commandstats(pair.primary) - before == Counter()


def test_the_environment_configures_it(pair: RedisReplicatedServers) -> None:
    env = {
        "LEASEGUARD_REDIS_URL": pair.url,
        "LEASEGUARD_REDIS_REPLICAS": "1",
        "LEASEGUARD_REDIS_REPLICA_TIMEOUT_MS": "250",
    }
    provider = ProviderConfig.from_env(env).build()
    assert isinstance(provider, RedisLeaseProvider)
    assert (provider.replicas, provider.replica_timeout_ms) == (1, 250)
    assert provider.acquire_lease("k", "a", TTL).acquired
    default = ProviderConfig.from_env({"LEASEGUARD_REDIS_URL": pair.url}).build()
    assert isinstance(default, RedisLeaseProvider) and default.replicas == 0
    for bad in ({"LEASEGUARD_REDIS_REPLICAS": "-1"}, {"LEASEGUARD_REDIS_REPLICA_TIMEOUT_MS": "0"}):
        with pytest.raises(ConfigurationError, match="LEASEGUARD_REDIS_REPLICA"):
            ProviderConfig.from_env({**env, **bad}).build()
    with pytest.raises(ConfigurationError, match="LEASEGUARD_REDIS_REPLICAS"):
        ProviderConfig.from_env({**env, "LEASEGUARD_REDIS_REPLICAS": "one"})


# -- what it costs: one round trip per step; nothing without it -----------------------------------


class SendCounter:
    """Counts what redis-py's connections write to their sockets: one write per round trip
    (a pipeline packs its commands into one write, then reads every reply)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sends = 0
        send = redis.connection.AbstractConnection.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            self.sends += 1
            send(conn, command, check_health)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)

    def of(self, call: Callable[[], T]) -> tuple[T, int]:
        before = self.sends
        result = call()
        return result, self.sends - before


def _steps(provider: RedisLeaseProvider, key: str) -> list[tuple[str, Callable[[], Any]]]:
    """Every write step once, in an order where each has something to act on."""
    handed: list[Signal] = []

    def hand_off() -> None:
        signal = provider.transfer_to_next(key, "b", TTL, claim=False)
        assert signal is not None
        handed.append(signal)

    def claim() -> None:
        token = handed[0].token
        assert token is not None
        assert provider.claim_signal(key, handed[0].id, token, TTL) is not None

    return [
        ("acquire", lambda: provider.acquire_lease(key, "a", TTL)),
        ("renew", lambda: provider.renew_lease(key, "a", TTL)),
        ("transfer", lambda: provider.transfer_lease(key, "a", "b", TTL)),
        ("acquire_or_enqueue", lambda: provider.acquire_or_enqueue(key, Signal("s1", 1), TTL)),
        ("acquire_or_enqueue", lambda: provider.acquire_or_enqueue(key, Signal("s2", 2), TTL)),
        ("take_signals", lambda: provider.take_signals(key, "b", 1)),
        ("transfer_to_next", hand_off),
        ("claim_signal", claim),
        ("release", lambda: provider.release_lease(key, handed[0].id)),
        ("redrive", lambda: provider.redrive(key)),
    ]


def test_each_write_step_is_one_round_trip_with_the_wait(
    pair: RedisReplicatedServers, clients: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = provider_on(clients(pair.primary))
    exercise_every_script(provider, "warm-up")  # loaded scripts, connections made
    counter = SendCounter(monkeypatch)
    for name, step in _steps(provider, "k"):
        before = commandstats(pair.primary)
        _, sends = counter.of(step)
        executed = commandstats(pair.primary) - before
        assert sends == 1, name
        assert executed["evalsha"] == executed["set"] == executed["wait"] == 1, name
    for name, read in [
        ("inspect", lambda: provider.inspect_key("k")),
        ("get_lease_owner", lambda: provider.get_lease_owner("k")),
        ("pending_signals", lambda: provider.pending_signals("k")),
    ]:
        before = commandstats(pair.primary)
        _, sends = counter.of(read)
        executed = commandstats(pair.primary) - before
        assert sends == 1 and executed["wait"] == executed["set"] == 0, name


def test_without_replicas_nothing_changes(
    pair: RedisReplicatedServers, clients: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default sends the scripts alone: no WAIT, no fence, and every step is answered
    whatever the replicas do (here: none listening)."""
    provider = RedisLeaseProvider(clients(pair.primary), prefix="rp:")
    assert provider.replicas == 0
    pair.replicas[0].promote()
    exercise_every_script(provider, "warm-up")
    counter = SendCounter(monkeypatch)
    before = commandstats(pair.primary)
    for name, step in _steps(provider, "k"):
        assert counter.of(step)[1] == 1, name
    executed = commandstats(pair.primary) - before
    assert executed["wait"] == executed["set"] == 0
    assert executed["evalsha"] == len(_steps(provider, "k"))


# -- what it prevents ---------------------------------------------------------------------------


def test_the_finding_without_the_option(pair: RedisReplicatedServers, clients: Any) -> None:
    """Issue 23, finding 5, as it happens without ``replicas``: the replica's link is down, a
    grant and two forwards are answered by the primary, the primary dies, the replica is
    promoted: a second owner is granted the key while the first still holds it, and both
    forwards are gone. The token floor holds: the second grant's token is higher."""
    provider = RedisLeaseProvider(clients(pair.primary), prefix="rp:")
    pair.replicas[0].promote()  # the link drops
    first = provider.acquire_or_enqueue("k", Signal("e0", 0), TTL)
    assert first.acquired
    for n in (1, 2):
        assert provider.acquire_or_enqueue("k", Signal(f"e{n}", n), TTL).position == n

    after = RedisLeaseProvider(clients(fail_over(pair)), prefix="rp:")
    second = after.acquire_or_enqueue("k", Signal("e3", 3), TTL)
    assert second.acquired and second.owner == "e3"  # two owners: e0 still runs
    assert after.inspect_key("k").queued == ()  # e1, e2: answered 202, gone
    assert first.token is not None and second.token is not None
    assert second.token > first.token  # the clock floor: both clocks are this machine's


def test_a_forward_nobody_replicated_fails_visibly(
    pair: RedisReplicatedServers, clients: Any
) -> None:
    """With ``replicas=1`` and the link down, the guard's forward raises (Lambda reports the
    invocation failed, the platform retries it) instead of answering 202."""
    provider = provider_on(clients(pair.primary))
    assert provider.acquire_or_enqueue("t1", Signal("first", 0), TTL).acquired
    pair.replicas[0].promote()

    ran: list[Any] = []
    handler = lease_owned("pathParameters.threadId", provider=provider, ttl_ms=TTL)(
        lambda event, context: ran.append(event)
    )
    with pytest.raises(NotReplicated) as raised:
        handler(http_event("t1", "second"), LambdaContext())
    error = raised.value
    assert isinstance(error, LeaseBackendError)
    assert (error.key, error.step) == ("t1", "acquire_or_enqueue")
    assert (error.acknowledged, error.required, error.timeout_ms) == (0, 1, WAIT_MS)
    assert ran == []
    # A grant is refused the same way, and so is the owner's renewal (its handle reads lost).
    with pytest.raises(NotReplicated):
        provider.acquire_or_enqueue("t2", Signal("other", 0), TTL)
    with pytest.raises(NotReplicated):
        provider.renew_lease("t1", "first", TTL)

    # The same handler, link up: the forward is answered 202 as before.
    pair.replicas[0].replicate(pair.primary.port)
    response = handler(http_event("t1", "third"), LambdaContext())
    assert response["statusCode"] == 202
    assert json.loads(response["body"])["leaseguard"]["status"] == "forwarded"


def test_acknowledged_writes_are_on_the_promoted_replica(
    pair: RedisReplicatedServers, clients: Any
) -> None:
    """Link up: the grant and both forwards are acknowledged by the replica, and after a
    failover the promoted replica has them all: the owner, its token, its deadline, the
    queue in order. A new event is forwarded behind the first owner, not granted."""
    provider = provider_on(clients(pair.primary))
    first = provider.acquire_or_enqueue("k", Signal("e0", 0), TTL)
    assert first.acquired
    for n in (1, 2):
        assert provider.acquire_or_enqueue("k", Signal(f"e{n}", n), TTL).position == n
    assert provider.renew_lease("k", "e0", 2 * TTL, token=first.token)

    after = provider_on(clients(fail_over(pair)), replicas=0)  # no replica left to wait for
    state = after.inspect_key("k")
    assert (state.owner, state.token) == ("e0", first.token)
    assert [s.id for s in state.queued] == ["e1", "e2"]
    assert state.remaining_ms is not None and TTL < state.remaining_ms <= 2 * TTL  # renewed
    third = after.acquire_or_enqueue("k", Signal("e3", 3), TTL)
    assert not third.acquired and (third.owner, third.position) == ("e0", 3)
    assert after.renew_lease("k", "e0", TTL, token=first.token)  # the owner carries on


def test_a_step_that_writes_nothing_still_waits_for_what_it_saw(
    pair: RedisReplicatedServers, clients: Any
) -> None:
    """A refused renewal is an answer that rests on another client's write (a transfer, made
    here by a provider without ``replicas``) that no replica has: it is not acknowledged
    either. (The fence is what makes this hold for a step that writes nothing: ``WAIT``
    counts replicas that reached the last write of its own connection.)"""
    plain = RedisLeaseProvider(clients(pair.primary), prefix="rp:")
    exercise_every_script(plain, "warm-up")  # the scripts are loaded: one EVALSHA each below
    assert plain.acquire_lease("k", "owner", TTL).acquired
    waiting = provider_on(clients(pair.primary))  # its connection has written nothing yet
    pair.replicas[0].pause()
    try:
        assert plain.transfer_lease("k", "owner", "next", TTL)
        with pytest.raises(NotReplicated) as raised:
            waiting.renew_lease("k", "owner", TTL)
        assert raised.value.acknowledged == 0
    finally:
        pair.replicas[0].resume()
    # Resumed, the replica catches up and the same refusal is acknowledged.
    assert waiting.renew_lease("k", "owner", TTL) is False


# -- what it cannot prevent -----------------------------------------------------------------------


def test_a_step_that_raised_did_apply_on_the_primary(
    pair: RedisReplicatedServers, clients: Any
) -> None:
    """NotReplicated is not "nothing happened": the forward is queued on the primary (it runs
    if the primary lives on), and sending it again is recognised as the same forward."""
    provider = provider_on(clients(pair.primary))
    assert provider.acquire_lease("k", "owner", TTL).acquired
    pair.replicas[0].promote()
    with pytest.raises(NotReplicated):
        provider.acquire_or_enqueue("k", Signal("e1", 1), TTL)
    assert [s.id for s in provider.inspect_key("k").queued] == ["e1"]
    pair.replicas[0].replicate(pair.primary.port)  # a full resync: the replica has it now
    assert provider.acquire_or_enqueue("k", Signal("e1", 1), TTL).position == 1
    assert [s.id for s in provider.inspect_key("k").queued] == ["e1"]


def test_wait_is_no_consensus_a_replica_that_did_not_acknowledge_can_be_promoted(
    clients: Any,
) -> None:
    """Two replicas, ``replicas=1``: one acknowledged, the other's link was down. A failover
    that promotes the one that did not acknowledge loses an acknowledged forward. (Redis
    Sentinel and ElastiCache prefer the replica with the highest replication offset, which
    avoids this while both are reachable; ``replicas`` equal to the replica count closes it.)"""
    with RedisReplicatedServers(2) as servers:
        provider = provider_on(clients(servers.primary))
        assert provider.acquire_lease("k", "owner", TTL).acquired
        servers.replicas[1].promote()  # its link drops
        assert provider.acquire_or_enqueue("k", Signal("e1", 1), TTL).position == 1  # acked

        with pytest.raises(NotReplicated) as raised:  # every replica required: refused
            provider_on(clients(servers.primary), replicas=2).acquire_or_enqueue(
                "k", Signal("e2", 2), TTL
            )
        assert (raised.value.acknowledged, raised.value.required) == (1, 2)

        behind = RedisLeaseProvider(clients(fail_over(servers, replica=1)), prefix="rp:")
        assert behind.inspect_key("k").queued == ()  # e1 acknowledged, and gone
        assert behind.inspect_key("k").owner == "owner"  # what it had before its link dropped


def test_a_renewal_not_acknowledged_leaves_the_replica_the_older_deadline(
    pair: RedisReplicatedServers, clients: Any
) -> None:
    """The replica holds the deadline of the last renewal it acknowledged; a renewal it did
    not acknowledge raised, so the owner's handle reads lost and no longer counts on it (the
    guard marks the lease lost on a failed renewal). The deadline travels as an absolute time
    and the promoted replica expires the lease by its own clock: the same here (one machine),
    earlier on a replica whose clock runs ahead; that no option can prevent."""
    provider = provider_on(clients(pair.primary))
    held = provider.acquire_lease("k", "a", TTL)
    pair.replicas[0].promote()  # the link drops
    with pytest.raises(NotReplicated) as raised:
        provider.renew_lease("k", "a", 4 * TTL, token=held.token)
    assert raised.value.step == "renew"
    on_primary = provider.inspect_key("k").remaining_ms
    assert on_primary is not None and on_primary > 3 * TTL  # applied on the primary

    after = RedisLeaseProvider(clients(fail_over(pair)), prefix="rp:").inspect_key("k")
    assert after.owner == "a" and after.remaining_ms is not None
    assert 0 < after.remaining_ms <= TTL  # the acknowledged deadline, not the renewal's


# -- Cluster: the WAIT goes to the primary that ran the script ---------------------------------


def test_cluster_waits_on_the_primary_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """One replica, of the first primary only: keys on it are acknowledged, keys on the
    others raise NotReplicated; every step is one round trip to the key's primary."""
    with RedisClusterWithReplicas(3, replicas=1) as cluster:
        client = RedisCluster.from_url(cluster.url)
        try:
            provider = provider_on(client)
            replicated = cluster.nodes[0].port
            for n in range(30):  # load the script, make the kept connections, on every primary
                with contextlib.suppress(NotReplicated):
                    provider.acquire_lease(f"warm-{n}", "a", TTL)
            counter = SendCounter(monkeypatch)
            outcomes: Counter[bool] = Counter()
            for _ in range(30):
                key = f"thread-{uuid.uuid4().hex[:6]}"
                port = client.get_node_from_key(provider.redis_keys(key)[0]).port
                try:
                    _, sends = counter.of(lambda key=key: provider.acquire_lease(key, "a", TTL))
                    assert port == replicated
                except NotReplicated as error:
                    assert port != replicated and error.acknowledged == 0
                    sends = 1
                outcomes[port == replicated] += 1
                assert sends == 1
            assert outcomes[True] and outcomes[False]
        finally:
            client.close()


# -- other clients: redis-py's pipeline ------------------------------------------------------------


class CustomRedis(redis.Redis):
    """A subclass: not sent on kept connections, through a redis-py pipeline instead."""


def test_a_client_subclass_waits_through_a_pipeline(
    pair: RedisReplicatedServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = CustomRedis.from_url(pair.url, socket_timeout=5)
    try:
        provider = provider_on(client)
        exercise_every_script(provider, "warm-up")
        counter = SendCounter(monkeypatch)
        assert counter.of(lambda: provider.acquire_lease("k", "a", TTL))[0].acquired
        assert counter.of(lambda: provider.renew_lease("k", "a", TTL))[1] == 1
        pair.replicas[0].promote()
        with pytest.raises(NotReplicated):
            provider.acquire_or_enqueue("k", Signal("e1", 1), TTL)
    finally:
        client.close()
