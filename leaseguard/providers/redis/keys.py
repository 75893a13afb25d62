"""The Redis key layout's building blocks: the hash-tag encoding of a user key and the Cluster
slots (see :mod:`leaseguard.providers.redis` for the layout itself)."""

from __future__ import annotations

import functools
from binascii import crc_hqx

CLUSTER_SLOTS = 16384


def escape_key(key: str) -> str:
    """The hash-tag form of a user key (see :mod:`leaseguard.providers.redis`)."""
    return key.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def key_slot(tag: str) -> int:
    return crc_hqx(tag.encode("utf-8"), 0) % CLUSTER_SLOTS


@functools.cache
def slot_tags() -> tuple[str, ...]:
    """For every Cluster slot, a short brace-free string that hashes to it (about 0.1 s to
    build, once per process)."""
    tags: list[str | None] = [None] * CLUSTER_SLOTS
    missing, n = CLUSTER_SLOTS, 0
    while missing:
        candidate = format(n, "x")
        slot = crc_hqx(candidate.encode(), 0) % CLUSTER_SLOTS
        if tags[slot] is None:
            tags[slot] = candidate
            missing -= 1
        n += 1
    return tuple(t for t in tags if t is not None)


def slot_index_key(prefix: str, slot: int, name: str) -> str:
    """On Cluster, slot ``slot``'s index ``name`` (``index``: keys with pending work,
    ``deadindex``: keys with dead letters), in that slot itself."""
    return f"{prefix}{{{slot_tags()[slot]}}}:{name}"
