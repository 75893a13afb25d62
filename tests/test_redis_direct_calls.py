"""A plain standalone client's script runs go on connections the provider keeps
(:mod:`leaseguard.providers.redis.direct`): one per caller at a time, reconnected when they
drop, never shared with a forked child, given back to the pool with the provider. A plain
``RedisCluster``'s go the same way to the primary of their slot, and through the client's
``execute_command`` whenever that primary does not simply answer."""

from __future__ import annotations

import gc
import multiprocessing as mp
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from leaseguard.errors import LeaseBackendError
from leaseguard.providers.redis import RedisLeaseProvider, escape_key, key_slot
from leaseguard.providers.redis.direct import ClusterCalls, DirectCalls

TTL = 10_000


@pytest.fixture
def name() -> str:
    return f"lg-direct-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def admin(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def connections(admin: redis.Redis, name: str) -> int:
    return sum(1 for c in admin.client_list() if c.get("name") == name)


def cycles(provider: RedisLeaseProvider, key: str, n: int) -> None:
    for i in range(n):
        owner = f"o{i}"
        assert provider.acquire_lease(key, owner, TTL).acquired
        assert provider.get_lease_owner(key) == owner
        provider.release_lease(key, owner)


def test_one_connection_serves_a_callers_calls(
    redis_url: str, admin: redis.Redis, name: str
) -> None:
    provider = RedisLeaseProvider(
        redis.Redis.from_url(redis_url, client_name=name), prefix=f"{name}:"
    )
    assert isinstance(provider.execute, DirectCalls)
    cycles(provider, "k", 50)
    # one kept for the scripts, one the pool lends get_lease_owner's HGET and takes back
    assert connections(admin, name) <= 2

    threads = [threading.Thread(target=cycles, args=(provider, f"k{t}", 50)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert connections(admin, name) <= 4 + 4  # at most one kept per thread running at once


def test_a_dropped_connection_is_reconnected(redis_url: str, admin: redis.Redis, name: str) -> None:
    provider = RedisLeaseProvider(
        redis.Redis.from_url(redis_url, client_name=name), prefix=f"{name}:"
    )
    assert provider.acquire_lease("k", "a", TTL).acquired
    ours = [c["id"] for c in admin.client_list() if c.get("name") == name]
    assert ours and all(admin.client_kill_filter(_id=cid) == 1 for cid in ours)
    assert provider.acquire_lease("k", "a", TTL).acquired  # the owner again: same lease
    provider.release_lease("k", "a")
    assert provider.get_lease_owner("k") is None


def _child_cycles(provider: RedisLeaseProvider, go: Any, out: Any) -> None:
    try:
        go.wait(30)
        cycles(provider, "child", 500)
        out.put("ok")
    except Exception as exc:  # reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_forked_child_never_writes_to_its_parents_connection(redis_url: str, name: str) -> None:
    """Parent and child run cycles at the same time; a shared socket would mix their replies."""
    client = redis.Redis.from_url(redis_url, client_name=name)
    provider = RedisLeaseProvider(client, prefix=f"{name}:")
    cycles(provider, "parent", 1)  # the parent keeps a connection before the fork
    context = mp.get_context("fork")
    out, go = context.Queue(), context.Event()
    child = context.Process(target=_child_cycles, args=(provider, go, out))
    child.start()
    go.set()
    cycles(provider, "parent", 500)
    assert out.get(timeout=120) == "ok"
    child.join(30)
    assert child.exitcode == 0


def test_the_connections_go_back_to_the_pool_with_the_provider(redis_url: str) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=0.5)
    client = redis.Redis(connection_pool=pool)
    provider = RedisLeaseProvider(client, prefix="gone:")
    assert provider.acquire_lease("k", "a", TTL).acquired  # takes the pool's one connection
    with pytest.raises(redis.ConnectionError):
        client.ping()  # none left to lend
    del provider
    gc.collect()
    assert client.ping()
    client.close()


def test_other_clients_keep_execute_command(redis_url: str, redis_cluster_url: str) -> None:
    single = redis.Redis.from_url(redis_url, single_connection_client=True)

    class Instrumented(redis.Redis):
        pass

    class InstrumentedCluster(RedisCluster):
        pass

    sub = Instrumented.from_url(redis_url)
    sub_cluster = InstrumentedCluster.from_url(redis_cluster_url)
    for client in (single, sub, sub_cluster):
        provider = RedisLeaseProvider(client, prefix=f"keep{uuid.uuid4().hex[:6]}:")
        assert provider.execute == client.execute_command
        assert provider.acquire_lease("k", "a", TTL).acquired
        client.close()


# -- Redis Cluster ------------------------------------------------------------------------------


@pytest.fixture
def cluster(redis_cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_cluster_url)
    yield client
    client.close()


def _sent_to(client: RedisCluster) -> dict[str, int]:
    """EVALSHA calls each primary has received so far: run, or rejected (a MOVED)."""
    sent = {}
    for node in client.get_primaries():
        stats = client.info("commandstats", target_nodes=node).get("cmdstat_evalsha", {})
        sent[node.name] = int(stats.get("calls", 0)) + int(stats.get("rejected_calls", 0))
    return sent


def test_a_cluster_script_goes_to_its_keys_primary_on_a_kept_connection(
    cluster: RedisCluster,
) -> None:
    provider = RedisLeaseProvider(cluster, prefix=f"cc{uuid.uuid4().hex[:6]}:")
    assert isinstance(provider.execute, ClusterCalls)
    keys = [f"order-{n}" for n in range(12)]
    cycles(provider, "warm", 1)  # every script loaded on every primary (NOSCRIPT counts a call)
    before = _sent_to(cluster)
    for key in keys:
        cycles(provider, key, 5)
    after = _sent_to(cluster)
    expected = dict.fromkeys(after, 0)
    for key in keys:
        expected[cluster.nodes_manager.get_node_from_slot(key_slot(escape_key(key))).name] += 10
    assert {n: after[n] - before[n] for n in after} == expected  # each on its own primary, once
    kept = provider.execute._by_node  # one kept connection per primary used, and no more
    assert set(kept) >= {n for n, calls in expected.items() if calls}
    assert all(len(calls._idle) == 1 for _, calls in kept.values())


def test_a_stale_slot_map_sends_the_script_again_through_the_cluster_client(
    cluster: RedisCluster,
) -> None:
    """redis-py's map names the wrong primary for a key's slot (a slot that moved): that
    primary answers MOVED without running the script, the cluster client follows the
    redirection and corrects its map, and the next call goes straight to the right primary."""
    provider = RedisLeaseProvider(cluster, prefix=f"cm{uuid.uuid4().hex[:6]}:")
    cycles(provider, "warm", 1)  # every script loaded on every primary (NOSCRIPT counts a call)
    key = "moved"
    slot = key_slot(escape_key(key))
    slots = cluster.nodes_manager.slots_cache
    right = slots[slot][0]
    wrong = next(n for n in cluster.get_primaries() if n.name != right.name)
    slots[slot] = [wrong]
    before = _sent_to(cluster)
    first = provider.acquire_lease(key, "a", TTL)
    assert cluster.nodes_manager.get_node_from_slot(slot).name == right.name  # corrected
    provider.release_lease(key, "a")
    after = _sent_to(cluster)
    assert first.acquired and provider.inspect_key(key).owner is None
    assert after[wrong.name] - before[wrong.name] == 1  # the MOVED, run nowhere
    assert after[right.name] - before[right.name] == 2  # the acquire once, the release
    second = provider.acquire_lease(key, "b", TTL)
    assert second.acquired and second.token is not None and second.token > (first.token or 0)


def test_a_cluster_connection_that_drops_is_replaced(cluster: RedisCluster) -> None:
    provider = RedisLeaseProvider(cluster, prefix=f"ck{uuid.uuid4().hex[:6]}:")
    key = "dropped"
    cycles(provider, key, 2)
    node = cluster.nodes_manager.get_node_from_slot(key_slot(escape_key(key)))
    kept = provider.execute._by_node[node.name][1]._idle
    assert len(kept) == 1
    own = kept[0]._sock.getsockname()
    listing = cluster.client_list(target_nodes=node)
    ours = [c["id"] for c in listing if c["addr"] == f"{own[0]}:{own[1]}"]
    assert len(ours) == 1 and cluster.client_kill_filter(_id=ours[0], target_nodes=node) == 1
    cycles(provider, key, 3)  # reconnected: no error reaches the caller
    assert provider.inspect_key(key).owner is None


def test_an_unreachable_server_is_a_backend_error_that_names_the_refusal() -> None:
    """Regression: the first connection was made while handling the IndexError of an empty
    idle list, so the refusal carried it as context and the CLI, which names the root cause,
    said "pop from empty list" instead of "Connection refused"."""
    from leaseguard import LeaseBackendError
    from leaseguard.testing import free_port

    provider = RedisLeaseProvider(redis.Redis(port=free_port(), socket_connect_timeout=1))
    with pytest.raises(LeaseBackendError, match="Connection refused") as raised:
        provider.acquire_lease("k", "a", TTL)
    chain: list[BaseException] = []
    exc: BaseException | None = raised.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    assert not any(isinstance(e, IndexError) for e in chain), chain


def test_a_slot_being_migrated_refuses_visibly_and_then_moves(cluster: RedisCluster) -> None:
    """Live resharding. While a key's slot migrates, its keys are on neither primary: the old
    one answers ASK, the new one answers TRYAGAIN to a multi-key script ("multiple keys request
    during rehashing of slot"), which every script is. redis-py retries, then gives up: the call
    fails with LeaseBackendError and wrote nothing, on either primary. Once the slot has moved,
    the old primary answers MOVED and the key works on the new one."""
    provider = RedisLeaseProvider(cluster, prefix=f"ca{uuid.uuid4().hex[:6]}:")
    assert isinstance(provider.execute, ClusterCalls)
    cycles(provider, "warm", 1)  # every script loaded on every primary
    key = f"resharded-{uuid.uuid4().hex[:6]}"
    slot = key_slot(escape_key(key))
    source = cluster.nodes_manager.get_node_from_slot(slot)
    target = next(n for n in cluster.get_primaries() if n.name != source.name)
    ids = {n.name: cluster.cluster_myid(n) for n in (source, target)}

    def setslot(node: Any, *args: str) -> None:
        cluster.execute_command("CLUSTER SETSLOT", slot, *args, target_nodes=node)

    def keys_in_slot(node: Any) -> list[bytes]:
        found: list[bytes] = cluster.execute_command(
            "CLUSTER GETKEYSINSLOT", slot, 1000, target_nodes=node
        )
        return found

    setslot(target, "IMPORTING", ids[source.name])
    setslot(source, "MIGRATING", ids[target.name])
    try:
        with pytest.raises(LeaseBackendError, match=r"TTL exhausted|TRYAGAIN|rehashing"):
            provider.acquire_lease(key, "a", TTL)
        assert keys_in_slot(source) == [] and keys_in_slot(target) == []  # nothing written
        for node in cluster.get_primaries():  # the migration ends: the target owns the slot
            setslot(node, "NODE", ids[target.name])
        granted = provider.acquire_lease(key, "b", TTL)  # MOVED, then the new map
        assert granted.acquired
        assert cluster.nodes_manager.get_node_from_slot(slot).name == target.name
        assert provider.inspect_key(key).owner == "b" and keys_in_slot(target)
        provider.release_lease(key, "b")
    finally:  # give the slot back, empty, so later tests on this cluster see the usual map
        for name in keys_in_slot(target):
            cluster.execute_command("DEL", name, target_nodes=target)
        for node in cluster.get_primaries():
            setslot(node, "NODE", ids[source.name])
