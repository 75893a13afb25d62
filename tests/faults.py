"""Fault injection for the ``test_faults_*`` modules: a Redis proxy that loses replies, and a
fenced downstream store.

:class:`ReplyDroppingProxy` sits between redis-py and a real Redis server and relays one RESP
command and its reply at a time. When a command matches an armed :class:`Drop`, the command
reaches Redis and runs, the proxy reads the reply, and then closes the client's connection
instead of passing the reply on: exactly what a ``CLIENT KILL`` (or a network cut) right after
the command was applied does, but at a point chosen by the test rather than by timing. redis-py
sees ``ConnectionError`` and resends the command on a new connection, so the test observes a
retried command meeting its own applied effect. The dropped reply is kept, so a test can compare
it with the reply the retry got.

:class:`Fence` is the downstream store of the fencing pattern: a write carries the writer's
fencing token and is applied only if no higher token wrote before, on Redis (one Lua script) or
DynamoDB (a conditional ``UpdateItem``, the pattern in the README).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import pytest
import redis
from redis.cluster import RedisCluster

from leaseguard.providers import redis as lg_redis
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import RedisClusterServers

# -- RESP ---------------------------------------------------------------------------------------


class _Incomplete(Exception):
    pass


def _line(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    return buf[pos:end], end + 2


def parse_resp(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """One RESP2/RESP3 value from ``buf`` at ``pos``: (value, position after it). Raises
    ``_Incomplete`` when ``buf`` does not hold the whole value yet."""
    if pos >= len(buf):
        raise _Incomplete
    kind = buf[pos : pos + 1]
    text, pos = _line(buf, pos + 1)
    if kind == b":":
        return int(text), pos
    if kind in (b"+", b",", b"_", b"#", b"("):
        return text, pos
    if kind == b"-":
        return ("error", text), pos
    if kind in (b"$", b"=", b"!"):
        size = int(text)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            raise _Incomplete
        return buf[pos : pos + size], pos + size + 2
    if kind in (b"*", b"~", b">", b"%", b"|"):
        count = int(text)
        if count < 0:
            return None, pos
        if kind in (b"%", b"|"):
            count *= 2
        items = []
        for _ in range(count):
            item, pos = parse_resp(buf, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"not RESP: {buf[pos - 1 : pos + 20]!r}")


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def frame(self) -> tuple[bytes, Any]:
        """The raw bytes and the parsed value of the next complete RESP value."""
        while True:
            try:
                value, end = parse_resp(self.buf)
            except _Incomplete:
                data = self.sock.recv(65536)
                if not data:
                    raise EOFError from None
                self.buf += data
                continue
            raw, self.buf = self.buf[:end], self.buf[end:]
            return raw, value


# -- the proxy ----------------------------------------------------------------------------------

Command = list[bytes]


@dataclass
class Drop:
    """Lose the reply of the next ``times`` commands that ``match`` (after Redis ran them).
    ``before_retry`` runs once the command was applied and before the client can resend it."""

    match: Callable[[Command], bool]
    times: int = 1
    before_retry: Callable[[], None] | None = None
    dropped: list[Any] = field(default_factory=list)  # the replies the client never saw


class FaultPlan:
    """Shared by every proxy of a cluster: the armed drops and a log of relayed commands."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.drops: list[Drop] = []
        self.seen: list[tuple[Command, Any]] = []  # (command, reply) for every command relayed

    def arm(self, drop: Drop) -> Drop:
        with self.lock:
            self.drops.append(drop)
        return drop

    def take(self, command: Command, reply: Any) -> Drop | None:
        """The armed drop for ``command``, if any. Only applied commands count: an error reply
        (``NOSCRIPT`` before a script is loaded, say) changed nothing and is passed on."""
        if isinstance(reply, tuple) and reply[:1] == ("error",):
            return None
        with self.lock:
            for drop in self.drops:
                if drop.times > 0 and drop.match(command):
                    drop.times -= 1
                    return drop
        return None

    def record(self, command: Command, reply: Any) -> None:
        with self.lock:
            self.seen.append((command, reply))

    def replies_to(self, match: Callable[[Command], bool]) -> list[Any]:
        """Replies Redis gave to matching commands that it ran, dropped or not, in order (error
        replies, which change nothing, are left out)."""
        with self.lock:
            return [
                reply
                for command, reply in self.seen
                if match(command) and not (isinstance(reply, tuple) and reply[:1] == ("error",))
            ]


class ReplyDroppingProxy:
    """A TCP proxy in front of one Redis server, on a free port of 127.0.0.1."""

    def __init__(self, upstream_port: int, plan: FaultPlan | None = None) -> None:
        self.upstream_port = upstream_port
        self.plan = plan or FaultPlan()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="fault-proxy")
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        with self._lock:
            self._sockets += [client, upstream]
        from_client, from_server = _Reader(client), _Reader(upstream)
        try:
            while True:
                raw_command, command = from_client.frame()
                upstream.sendall(raw_command)
                raw_reply, reply = from_server.frame()
                parts = [bytes(p) for p in command] if isinstance(command, list) else []
                self.plan.record(parts, reply)
                drop = self.plan.take(parts, reply)
                if drop is not None:
                    drop.dropped.append(reply)
                    if drop.before_retry is not None:
                        drop.before_retry()
                    return  # the command ran; its reply is lost with the connection
                client.sendall(raw_reply)
        except (EOFError, OSError):
            return
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        self._thread.join(5)


def evalsha_of(sha: str) -> Callable[[Command], bool]:
    """Matches EVALSHA of one script (by its SHA1)."""
    wanted = sha.encode()

    def match(command: Command) -> bool:
        return len(command) > 1 and command[0].upper() == b"EVALSHA" and command[1] == wanted

    return match


# -- the fenced downstream store ------------------------------------------------------------------

_FENCED_SET = """
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < fence then
  return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
"""


@dataclass
class Rig:
    """``provider`` talks through reply-dropping proxies; ``direct`` to the servers."""

    provider: RedisLeaseProvider
    direct: RedisLeaseProvider
    plan: FaultPlan

    def lose_reply(
        self, script: lg_redis.LuaScript, before_retry: Callable[[], None] | None = None
    ) -> Drop:
        return self.plan.arm(Drop(evalsha_of(script.sha), before_retry=before_retry))

    def replies(self, script: lg_redis.LuaScript) -> list[Any]:
        """What Redis answered to every run of ``script`` through the proxy, in order."""
        return self.plan.replies_to(evalsha_of(script.sha))


@contextmanager
def proxied_rig(request: pytest.FixtureRequest, backend: str, prefix: str) -> Iterator[Rig]:
    """A :class:`Rig` on the session's standalone server (``backend="redis"``) or on every
    node of its Cluster (``"redis-cluster"``), keys under ``prefix``."""
    plan = FaultPlan()
    if backend == "redis":
        url = urlparse(request.getfixturevalue("redis_url"))
        assert url.hostname in ("127.0.0.1", "localhost") and url.port is not None
        proxies = [ReplyDroppingProxy(url.port, plan)]
        through = RedisLeaseProvider.from_url(
            f"redis://127.0.0.1:{proxies[0].port}/0", prefix=prefix
        )
        direct = RedisLeaseProvider(redis.Redis(port=url.port), prefix=prefix)
    else:
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        proxies = [ReplyDroppingProxy(node.port, plan) for node in cluster.nodes]
        ports = {node.port: proxy.port for node, proxy in zip(cluster.nodes, proxies, strict=True)}

        def remap(address: tuple[str, int]) -> tuple[str, int]:
            return ("127.0.0.1", ports.get(address[1], address[1]))

        through = RedisLeaseProvider.from_url(
            f"redis://127.0.0.1:{proxies[0].port}/0",
            cluster=True,
            prefix=prefix,
            address_remap=remap,
        )
        direct = RedisLeaseProvider(RedisCluster.from_url(cluster.url), prefix=prefix)
    try:
        yield Rig(through, direct, plan)
    finally:
        through.client.close()
        direct.client.close()
        for proxy in proxies:
            proxy.close()


@dataclass(frozen=True)
class Fence:
    """Where a guarded handler writes its result, conditional on its fencing token: a write
    with a token lower than one already written is refused. Picklable, so a worker process
    builds its own client."""

    redis_url: str | None = None
    cluster: bool = False
    table: str | None = None
    endpoint: str | None = None

    def write(self, key: str, token: int, value: str) -> bool:
        """Apply ``value`` under ``token``; ``False`` when a higher token wrote first."""
        if self.redis_url is not None:
            return bool(self._redis().eval(_FENCED_SET, 1, f"fence:{{{key}}}", token, value))
        from botocore.exceptions import ClientError

        try:
            self._dynamodb().update_item(
                TableName=self.table,
                Key={"pk": {"S": key}},
                UpdateExpression="SET fence = :t, #v = :v",
                ConditionExpression="attribute_not_exists(fence) OR fence <= :t",
                ExpressionAttributeNames={"#v": "value"},
                ExpressionAttributeValues={":t": {"N": str(token)}, ":v": {"S": value}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def read(self, key: str) -> tuple[int, str] | None:
        """(token, value) of the last accepted write."""
        if self.redis_url is not None:
            found = self._redis().hmget(f"fence:{{{key}}}", "fence", "value")
            if found[0] is None:
                return None
            return int(found[0]), found[1].decode()
        item = (
            self._dynamodb()
            .get_item(TableName=self.table, Key={"pk": {"S": key}}, ConsistentRead=True)
            .get("Item")
        )
        if item is None:
            return None
        return int(item["fence"]["N"]), str(item["value"]["S"])

    def create(self) -> Fence:
        if self.table is not None:
            self._dynamodb().create_table(
                TableName=self.table,
                BillingMode="PAY_PER_REQUEST",
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            )
        return self

    def _redis(self) -> Any:
        client = _CLIENTS.get(self)
        if client is None:
            import redis
            from redis.cluster import RedisCluster

            assert self.redis_url is not None
            client = (RedisCluster if self.cluster else redis.Redis).from_url(self.redis_url)
            _CLIENTS[self] = client
        return client

    def _dynamodb(self) -> Any:
        client = _CLIENTS.get(self)
        if client is None:
            import boto3

            client = boto3.client("dynamodb", endpoint_url=self.endpoint, region_name="us-east-1")
            _CLIENTS[self] = client
        return client


_CLIENTS: dict[Fence, Any] = {}
os.register_at_fork(after_in_child=_CLIENTS.clear)  # a child makes its own connections


class CountingMetrics:
    """Collects metric names the way a Powertools ``Metrics`` object receives them."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.names.append(name)


class ListLogger:
    """A stdlib-shaped logger that keeps (level, message) pairs."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def log(self, level: int, message: str, *args: Any, **kwargs: Any) -> None:
        self.lines.append((level, message))

    def messages(self, level: int = 0) -> list[str]:
        return [message for lvl, message in self.lines if lvl >= level]
