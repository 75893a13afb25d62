"""Redis replicas for tests: a primary with replicas, and replicas in a Cluster.

A replica is ready once its primary has its acknowledgement of a recent write, so a test's
first ``WAIT`` counts it at once (a replica fresh from its first sync may acknowledge up to a
second late).
"""

from __future__ import annotations

import time
from typing import Any

from leaseguard.errors import extra_required

from .servers import (
    START_TIMEOUT_S,
    ManagedServer,
    RedisClusterServers,
    RedisServer,
    as_text_dict,
    text_of,
)


class RedisReplica(RedisServer):
    """A :class:`RedisServer` that replicates another (``replica_of``, a port on 127.0.0.1);
    :meth:`start` returns once it is linked and acknowledged."""

    def start(self) -> RedisReplica:
        super().start()
        if self.replica_of is not None and not self.cluster:
            self.wait_for_link()
        return self

    def replication(self) -> dict[str, str]:
        """``INFO replication`` as text fields (``role``, ``master_link_status``, ...)."""
        return as_text_dict(self._command("INFO", "replication"))

    def wait_for_link(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once this replica's link to its primary is up and the primary lists it as
        online and has acknowledged a write made after that (only then does the primary count
        it in ``WAIT`` without delay: a replica fresh from its first sync may take its first
        acknowledgement up to a second late)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.replication().get("master_link_status") == "up" and self._acknowledged():
                return
            time.sleep(0.05)
        raise RuntimeError(f"replica on port {self.port} did not link to its primary in time")

    def _acknowledged(self) -> bool:
        """The primary lists this replica online, with an acknowledged offset at least that
        of a write the primary made just before it was asked."""
        with extra_required("testing", "leaseguard.testing's Redis servers"):
            import redis

        if self.replica_of is None:
            return False
        with redis.Redis(port=self.replica_of, socket_timeout=10) as primary:
            if not self.cluster:  # (on Cluster the key may belong to another primary)
                primary.set("leaseguard-harness:replica-sync", self.port)
            target = int(primary.info("replication")["master_repl_offset"])
            primary.execute_command("WAIT", 1, 50)  # the primary asks its replicas to ack
            row = self._row_at(primary.info("replication"))
        return row is not None and row.get("state") == "online" and int(row["offset"]) >= target

    def _row_at(self, replication: dict[str, Any]) -> dict[str, Any] | None:
        """This replica's ``slaveN`` row in its primary's ``INFO replication``."""
        for name, row in replication.items():
            if name.startswith("slave") and isinstance(row, dict) and row.get("port") == self.port:
                return row
        return None

    def replicate(self, port: int) -> None:
        """Become (again) the replica of the server on ``port``; returns once linked."""
        self._command("REPLICAOF", "127.0.0.1", port)
        self.replica_of = port
        self.wait_for_link()

    def promote(self) -> None:
        """``REPLICAOF NO ONE``: stop replicating and accept writes, keeping the data it has (a
        failover's promotion; also how a test drops a replica's link for good)."""
        self._command("REPLICAOF", "NO", "ONE")
        self.replica_of = None


class RedisReplicatedServers(ManagedServer):
    """A primary and ``replicas`` replicas of it, each on a free port; :meth:`start` returns
    once every replica's link is up."""

    def __init__(self, replicas: int = 1, *, binary: str | None = None) -> None:
        self.primary = RedisServer(binary=binary)
        self.replicas = [
            RedisReplica(binary=binary, replica_of=self.primary.port) for _ in range(replicas)
        ]

    @property
    def url(self) -> str:
        return self.primary.url

    def start(self) -> RedisReplicatedServers:
        try:
            self.primary.start()
            for replica in self.replicas:
                replica.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def cleanup(self) -> None:
        for server in (*self.replicas, self.primary):
            server.cleanup()


class RedisClusterWithReplicas(RedisClusterServers):
    """A :class:`~.servers.RedisClusterServers` plus ``replicas`` nodes, each the replica of
    one of the first masters (``CLUSTER REPLICATE``), in :attr:`replicas`."""

    def __init__(self, masters: int = 3, *, replicas: int = 1, binary: str | None = None) -> None:
        if not 0 <= replicas <= masters:
            raise ValueError("at most one replica per master")
        super().__init__(masters, binary=binary)
        self.replicas = [RedisReplica(cluster=True, binary=binary) for _ in range(replicas)]

    def _form(self) -> None:
        with extra_required("testing", "leaseguard.testing's Redis servers"):
            import redis

        super()._form()
        with redis.Redis(port=self.nodes[0].port, socket_timeout=5) as first:
            attach_replicas(self.nodes, self.replicas, first)


def attach_replicas(masters: list[RedisServer], replicas: list[RedisServer], first: Any) -> None:
    """Each of ``replicas`` follows one of ``masters`` (``CLUSTER MEET``, ``CLUSTER
    REPLICATE``); ``first`` is a client of a node already in the cluster."""
    with extra_required("testing", "leaseguard.testing's Redis servers"):
        import redis

    for master, replica in zip(masters, replicas, strict=False):
        replica.start()
        master_id = text_of(master._command("CLUSTER", "MYID"))
        first.cluster("MEET", "127.0.0.1", replica.port)
        with redis.Redis(port=replica.port, socket_timeout=5) as client:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:  # the replica must know the master's id before it can follow it
                try:
                    client.execute_command("CLUSTER REPLICATE", master_id)
                    break
                except redis.exceptions.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        replica.replica_of = master.port
        if isinstance(replica, RedisReplica):
            replica.wait_for_link()
