"""On Redis Cluster, the per-slot indexes (orphans, dead letters) are read by one script run per
primary (``scan_slot_indexes.lua``); redis-py's pipeline of one command per slot is the fallback.
Both must find the same keys, and a slot map gone stale must still find everything."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from leaseguard import Signal
from leaseguard.providers.redis import RedisLeaseProvider, escape_key, key_slot

KEYS = 24
TTL = 60_000


@pytest.fixture
def client(redis_cluster_url: str) -> Iterator[RedisCluster]:
    made = RedisCluster.from_url(redis_cluster_url)
    yield made
    made.close()


def provider(client: RedisCluster, prefix: str) -> RedisLeaseProvider:
    return RedisLeaseProvider(client, prefix=prefix)


def orphan_and_dead_letter(made: RedisLeaseProvider, keys: list[str]) -> None:
    """Every key: its owner's signal dead-lettered, a second signal queued behind a third
    owner whose lease then runs out (an orphan)."""
    for key in keys:
        first = made.acquire_or_enqueue(key, Signal(f"{key}/a", 1), TTL)
        made.acquire_or_enqueue(key, Signal(f"{key}/b", 2), TTL)
        made.acquire_or_enqueue(key, Signal(f"{key}/c", 3), TTL)
        head = made.transfer_to_next(key, f"{key}/a", TTL, token=first.token, error="x",
                                     max_attempts=1)  # fmt: skip
        assert head is not None and head.id == f"{key}/b"
        assert made.renew_lease(key, head.id, 1, token=head.token)  # its owner dies
    time.sleep(0.01)


def test_one_script_run_per_primary_finds_what_the_pipeline_finds(client: RedisCluster) -> None:
    prefix = f"ix{uuid.uuid4().hex[:8]}:"
    keys = [f"k{n} {{{n}}}" for n in range(KEYS)]
    assert len({client.nodes_manager.get_node_from_slot(key_slot(escape_key(k))).name
                for k in keys}) == 3  # fmt: skip
    scripted = provider(client, prefix)
    orphan_and_dead_letter(scripted, keys)
    piped = provider(client, prefix)
    assert piped._slot_indexes is not None
    piped._slot_indexes.scripted = False  # what a server before Redis 7 gets

    # one key per slot here, so the pipeline's answer for a smaller limit is a prefix of this
    all_orphans, all_dead = piped._orphan_candidates(1000), piped.dead_letter_keys(1000)
    assert sorted(all_orphans) == sorted(keys) and all_dead == sorted(keys)
    for limit in (1, 5, KEYS, 1000):
        assert scripted._orphan_candidates(limit) == all_orphans[:limit]
        assert scripted.dead_letter_keys(limit) == all_dead[:limit]
    assert scripted._slot_indexes is not None and scripted._slot_indexes.scripted

    adopted = dict(scripted.adopt_orphans(TTL, 1000))
    assert {key: signal.id for key, signal in adopted.items()} == {
        k: f"{k}/b" for k in keys
    }  # in flight when its owner died
    assert scripted._orphan_candidates(1000) == []


def test_a_stale_slot_map_falls_back_to_the_pipeline_and_finds_everything(
    client: RedisCluster,
) -> None:
    """A slot that moved (here: redis-py's map names the wrong primary for one key's slot) is
    refused by the script on the node that does not serve it; the pipeline follows the MOVED
    redirection, redis-py corrects its map, and the next scan runs the script again."""
    prefix = f"ix{uuid.uuid4().hex[:8]}:"
    keys = [f"stale {{{n}}}" for n in range(6)]
    made = provider(client, prefix)
    orphan_and_dead_letter(made, keys)

    slots = client.nodes_manager.slots_cache
    slot = key_slot(escape_key(keys[0]))
    right = slots[slot][0]
    wrong = next(n for n in client.get_primaries() if n.name != right.name)
    slots[slot] = [wrong]
    fresh = provider(client, prefix)  # groups the slots from the stale map

    assert sorted(fresh._orphan_candidates(1000)) == sorted(keys)
    assert client.nodes_manager.get_node_from_slot(slot).name == right.name  # corrected
    assert fresh.dead_letter_keys(1000) == sorted(keys)  # the script again, on the new map
    assert fresh._slot_indexes is not None and fresh._slot_indexes.scripted


def test_a_server_that_refuses_the_script_is_read_by_the_pipeline(
    client: RedisCluster, redis_cluster_url: str
) -> None:
    """What a server before Redis 7 does (it cannot compile the script's flags line), shown
    by a user who may not load scripts: the scan falls back to the pipeline for good and
    still finds every key."""
    prefix = f"ix{uuid.uuid4().hex[:8]}:"
    user, password = f"noload{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    for node in client.get_primaries():
        admin = client.get_redis_connection(node)
        admin.script_flush()  # the scan script must be loaded again, by the limited user
        admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"],
                          commands=["+@all", "-script|load"])  # fmt: skip
    keys = [f"refused {{{n}}}" for n in range(5)]
    orphan_and_dead_letter(provider(client, prefix), keys)
    scheme, rest = redis_cluster_url.split("://", 1)
    limited = RedisCluster.from_url(f"{scheme}://{user}:{password}@{rest}")
    try:
        made = provider(limited, prefix)
        assert sorted(made._orphan_candidates(1000)) == sorted(keys)
        assert made._slot_indexes is not None and not made._slot_indexes.scripted
        assert made.dead_letter_keys(1000) == sorted(keys)
    finally:
        limited.close()
        for node in client.get_primaries():
            client.get_redis_connection(node).acl_deluser(user)
