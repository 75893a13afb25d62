"""Reading a Redis Cluster's per-slot indexes (the orphan index, the dead-letter index): one
script run per primary, not one command per slot.

Keys with pending work, and keys with dead letters, are indexed in one sorted set per Cluster
slot, so that every script updates the index in its own key's slot. Read through redis-py's
Cluster pipeline, the 16,384 commands cost about 50 µs of Python each to route: near a second of
CPU for every sweep and every dead-letter listing. ``scan_slot_indexes.lua`` reads all the slot
indexes of one primary in one run instead (Redis 7's ``allow-cross-slot-keys`` flag). The
pipeline stays the way when the script cannot be used: before Redis 7 (the script does not
load), or when a slot moved since redis-py last read the slot map (the script refuses the key
that is not local; the pipeline follows the redirection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .keys import CLUSTER_SLOTS, slot_index_key, slot_tags
from .scripts import SCAN_SLOT_INDEXES_LUA

if TYPE_CHECKING:
    from redis.cluster import ClusterNode, RedisCluster


class SlotIndexes:
    """The per-slot indexes ``<prefix>{<slot tag>}:<name>`` of one Cluster client."""

    def __init__(self, client: RedisCluster, prefix: str) -> None:
        import redis

        self.client: Any = client  # redis-py's RedisCluster is not typed throughout
        self.prefix = prefix
        self.scripted = True  # until a server refuses the script itself (Redis before 7)
        self._slot_map: object = None  # the redis-py slot map the grouping below was made from
        self._by_primary: list[tuple[ClusterNode, list[int]]] = []
        self._redis_error = redis.exceptions.RedisError
        self._no_script = redis.exceptions.NoScriptError
        self._response_error = redis.exceptions.ResponseError

    def orphans(self, name: str, max_score: int, limit: int) -> list[Any]:
        """Members scored at most ``max_score``, up to ``limit`` per slot, the first ``limit``
        of them in slot order."""
        found = self._read(name, "o", max_score, limit, stop=True)
        if found is None:
            found = self._pipelined(name, lambda p, key: p.zrangebyscore(key, "-inf", max_score,
                                                                       0, limit))  # fmt: skip
        return found[:limit]

    def members(self, name: str, limit: int) -> list[Any]:
        """The first ``limit`` members (byte order) of every slot's index, in slot order."""
        found = self._read(name, "d", 0, limit, stop=False)
        if found is None:
            found = self._pipelined(name, lambda p, key: p.zrange(key, 0, limit - 1))
        return found

    # -- one script run per primary -------------------------------------------------------------

    def _read(
        self, name: str, mode: str, max_score: int, limit: int, stop: bool
    ) -> list[Any] | None:
        """The members in slot order, or None when the pipeline must read them instead."""
        if not self.scripted:
            return None
        script = SCAN_SLOT_INDEXES_LUA
        tags = slot_tags()
        found: list[tuple[int, int, Any]] = []
        try:
            for node, slots in self._primaries():
                args = (self.prefix, name, mode, max_score, limit, int(stop))
                call = ("EVALSHA", script.sha, 0, *args, *(tags[s] for s in slots))
                try:
                    reply = self.client.execute_command(*call, target_nodes=node)
                except self._no_script:
                    try:
                        self.client.script_load(script.text)  # on every primary
                    except self._response_error:
                        self.scripted = False  # the server refuses the script: Redis before 7
                        return None
                    reply = self.client.execute_command(*call, target_nodes=node)
                found.extend(
                    (slots[int(reply[n]) - 1], n, reply[n + 1]) for n in range(0, len(reply), 2)
                )
        except self._redis_error:
            self._slot_map = None  # a slot moved, or a node failed: read the map again
            return None
        found.sort(key=lambda entry: entry[:2])  # slot order; within a slot, the index's order
        return [member for _, _, member in found]

    def _primaries(self) -> list[tuple[ClusterNode, list[int]]]:
        """Each primary with the slots it serves, in ascending order, as redis-py's slot map
        says (built again whenever redis-py replaces its map)."""
        nodes = self.client.nodes_manager
        if self._slot_map is not nodes.slots_cache:
            grouped: dict[str, tuple[ClusterNode, list[int]]] = {}
            for slot in range(CLUSTER_SLOTS):
                node = nodes.get_node_from_slot(slot)
                grouped.setdefault(node.name, (node, []))[1].append(slot)
            self._by_primary = list(grouped.values())
            self._slot_map = nodes.slots_cache
        return self._by_primary

    # -- the fallback: redis-py's Cluster pipeline -----------------------------------------------

    def _pipelined(self, name: str, command: Any) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for slot in range(CLUSTER_SLOTS):
            command(pipe, slot_index_key(self.prefix, slot, name))
        return [member for batch in pipe.execute() for member in batch]
