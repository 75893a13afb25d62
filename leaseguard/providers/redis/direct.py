"""Script runs sent on connections the provider keeps, without redis-py's per-command machinery.

``Redis.execute_command`` takes a connection from the pool and gives it back for every command,
and redis-py 8 adds its observability hooks and a ``poll()`` of the socket to each: about 50 µs
of Python per command on the 2-core VM of docs/benchmarks.md, as much as the round trip itself
on loopback, and every lease operation is one command. :class:`DirectCalls` keeps the
connections it has taken from the client's pool (one per caller running at the same moment:
usually two, the handler's thread and the renewer's) and sends each command on one of them,
under the connection's own retry policy, the one ``execute_command`` applies: a connection that
drops is reconnected and the command sent again, as before (every script is safe to run twice),
and one found closed while idle is reconnected before it is used, as the pool does.

Only a plain standalone ``redis.Redis`` gets it (not a single-connection client, not a subclass,
whose ``execute_command`` may do more); a plain ``RedisCluster`` gets :class:`ClusterCalls`,
which sends each script to the primary its keys live on the same way and leaves everything
else (redirections, failovers, a cluster that is down) to the client's ``execute_command``.
The others keep ``execute_command``. The connections go back to the pool when the provider is
collected.

With ``replicas=N`` a write step is three commands sent together (the script, a fence write and
``WAIT``, see :mod:`.provider`): :meth:`DirectCalls.pipeline` and :meth:`ClusterCalls.pipeline`
write them to one kept connection at once and read the three replies, one round trip; the
other clients get redis-py's own non-transactional pipeline, which does the same on one
connection (:func:`pipelined_calls`).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis import Redis

Command = tuple[Any, ...]
Pipelined = Callable[[Sequence[Command]], list[Any]]
"""Sends commands in one round trip on one connection and returns their replies in order; an
error reply is returned in its place as the ``ResponseError`` it parses to, never raised."""


def direct_calls(client: Any) -> DirectCalls | ClusterCalls | None:
    """A :class:`DirectCalls` for ``client`` if it is a plain pooled ``redis.Redis``, a
    :class:`ClusterCalls` if it is a plain ``RedisCluster``, else ``None``."""
    import redis
    from redis.cluster import RedisCluster

    if type(client) is RedisCluster:
        return ClusterCalls(client)
    if type(client) is not redis.Redis or getattr(client, "connection", None) is not None:
        return None
    return DirectCalls(client)


def pipelined_calls(client: Any, execute: Any) -> Pipelined:
    """How ``client`` sends several commands in one round trip: the kept connections of
    ``execute`` (a :class:`DirectCalls` or :class:`ClusterCalls`) when it has them, else a
    redis-py pipeline of a standalone client, else (a ``RedisCluster`` subclass) a
    :class:`ClusterCalls` of its own, since a cluster pipeline would send a keyless ``WAIT`` to
    any node rather than to the primary that ran the script."""
    from redis.cluster import RedisCluster

    if isinstance(execute, DirectCalls | ClusterCalls):
        return execute.pipeline
    if isinstance(client, RedisCluster):
        return ClusterCalls(client).pipeline

    def through_pipeline(commands: Sequence[Command]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    return through_pipeline


class DirectCalls:
    """``execute_command`` for EVALSHA and other single commands, on kept connections."""

    def __init__(self, client: Redis) -> None:
        import redis

        self.pool: Any = client.connection_pool
        self._idle: list[Any] = []  # the same list for life: the finalizer gives these back
        self._pid = os.getpid()
        self._response_error = redis.exceptions.ResponseError
        self._connection_errors = (redis.ConnectionError, redis.TimeoutError, OSError)
        weakref.finalize(self, _give_back, self.pool, self._idle, self._pid)

    def __call__(self, *args: Any) -> Any:
        conn = self._take()
        try:
            return conn.retry.call_with_retry(
                lambda: _round_trip(conn, args), lambda error: conn.disconnect()
            )
        except self._response_error:
            raise  # an error reply (NOSCRIPT, a script error) was read whole
        except BaseException:
            conn.disconnect()  # a reply may be left unread: the next use connects afresh
            raise
        finally:
            self._idle.append(conn)

    def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """``commands`` written to one kept connection at once, their replies read in order:
        one round trip. A dropped connection sends them all again, as :meth:`__call__` does."""
        conn = self._take()
        try:
            return list(
                conn.retry.call_with_retry(
                    lambda: self._pipelined_trip(conn, commands), lambda error: conn.disconnect()
                )
            )
        except BaseException:
            conn.disconnect()  # a reply may be left unread: the next use connects afresh
            raise
        finally:
            self._idle.append(conn)

    def _pipelined_trip(self, conn: Any, commands: Sequence[Command]) -> list[Any]:
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except self._response_error as error:  # read whole: the next reply follows it
                replies.append(error)
        return replies

    def _take(self) -> Any:
        if self._pid != os.getpid():
            # A forked child must not write to its parent's sockets: it takes its own from the
            # pool (which redis-py resets in the child).
            self._idle.clear()
            self._pid = os.getpid()
        try:
            conn = self._idle.pop()
        except IndexError:  # (another thread may have taken the last one since a check)
            conn = None
        if conn is None:
            # Not inside an `except`: a connection error would carry that exception as its
            # context, and error messages that name the root cause would name it.
            return self._new()
        # As the pool checks a connection it lends: one closed while idle (a server or proxy
        # timeout, a warm Lambda thawed after minutes) starts over before a command is lost
        # on it, whatever the retry policy.
        try:
            stale = conn.can_read()
        except self._connection_errors:
            stale = True
        if stale:
            conn.disconnect()
        return conn

    def _new(self) -> Any:
        try:
            return self.pool.get_connection()
        except TypeError:  # redis-py before 5.3 wants a command name
            pass
        return self.pool.get_connection("EVALSHA")


class ClusterCalls:
    """``execute_command`` for a ``RedisCluster``'s script runs: each ``EVALSHA`` goes straight
    to the primary that serves its keys' slot (all of a script's keys share one), on a
    connection kept as :class:`DirectCalls` keeps them.

    redis-py's ``RedisCluster.execute_command`` costs about 130 µs of client CPU a command on
    the VM of docs/benchmarks.md, against about 45 µs sent this way. What the cluster client
    does beyond routing stays with it: a reply that is not the script's own (a ``MOVED`` or
    ``ASK`` redirection, ``TRYAGAIN``, ``CLUSTERDOWN``, a replica's ``READONLY``) or a connection
    that failed sends the same command again through ``execute_command``, which follows the
    redirection, refreshes its slot map, and retries as it always did. Sending a script twice
    is safe: each recognises its own resend (docs/protocol.md, invariant h).
    """

    def __init__(self, client: Any) -> None:
        import redis
        from redis import exceptions as e

        self.client = client
        self._by_node: dict[str, tuple[Any, DirectCalls]] = {}
        self._moved = e.MovedError
        self._send_again = (  # (MOVED, caught first, is an AskError; CLUSTERDOWN a ClusterError)
            e.AskError,
            e.TryAgainError,
            e.ReadOnlyError,
            e.ClusterError,
            redis.ConnectionError,
            redis.TimeoutError,
            OSError,
        )

    def __call__(self, *args: Any) -> Any:
        if args[0] != "EVALSHA" or not args[2]:
            return self.client.execute_command(*args)
        try:
            node = self.client.nodes_manager.get_node_from_slot(self.client.keyslot(args[3]))
            calls = self._calls(node)
        except Exception:  # no node known for the slot (yet): the client finds one
            return self.client.execute_command(*args)
        try:
            return calls(*args)
        except self._moved as moved:
            # What the cluster client does with a MOVED it meets: the map points at the new
            # primary before the command is sent again, not after a second MOVED (redis-py 6+
            # calls it move_slot, earlier versions update_moved_exception).
            with contextlib.suppress(Exception):
                nodes = self.client.nodes_manager
                (getattr(nodes, "move_slot", None) or nodes.update_moved_exception)(moved)
            return self.client.execute_command(*args)
        except self._send_again:
            return self.client.execute_command(*args)

    def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """``commands`` (an ``EVALSHA`` first, then commands with no keys of their own, such as
        ``WAIT``) sent in one round trip to the primary of the script's keys, on one kept
        connection, so a ``WAIT`` counts the replicas of the primary that ran the script.

        When that primary does not simply answer (a redirection, a failover, a dropped
        connection), the script goes through the client's ``execute_command`` as in
        :meth:`__call__`, and the commands after it then go to the primary the client's map
        names for the slot: a second round trip, on that path only."""
        script = commands[0]
        try:
            slot = self.client.keyslot(script[3])
            calls = self._calls(self.client.nodes_manager.get_node_from_slot(slot))
        except Exception:  # no node known for the slot (yet): the client finds one
            return self._by_client(commands)
        try:
            replies = calls.pipeline(commands)
        except self._send_again:
            return self._by_client(commands)
        first = replies[0]
        if isinstance(first, self._moved):
            with contextlib.suppress(Exception):
                nodes = self.client.nodes_manager
                (getattr(nodes, "move_slot", None) or nodes.update_moved_exception)(first)
            return self._by_client(commands)
        if isinstance(first, self._send_again):
            return self._by_client(commands)
        return replies

    def _by_client(self, commands: Sequence[Command]) -> list[Any]:
        import redis

        script = commands[0]
        try:
            first: Any = self.client.execute_command(*script)
        except redis.exceptions.ResponseError as error:  # NOSCRIPT, a script error: the caller's
            first = error
        # After the client found the slot's primary (and ran the script there): the rest on a
        # connection to that primary. A fence write among them orders them after the script in
        # its replication stream (see provider.py), whichever connection ran the script.
        node = self.client.nodes_manager.get_node_from_slot(self.client.keyslot(script[3]))
        return [first, *self._calls(node).pipeline(commands[1:])]

    def _calls(self, node: Any) -> DirectCalls:
        client = node.redis_connection
        if client is None:
            raise LookupError(f"no client for {node.name} yet")
        kept = self._by_node.get(node.name)
        if kept is None or kept[0] is not client:  # new, or the cluster client replaced it
            kept = (client, DirectCalls(client))
            self._by_node[node.name] = kept
        return kept[1]


def _round_trip(conn: Any, args: tuple[Any, ...]) -> Any:
    conn.send_command(*args)
    return conn.read_response()


def _give_back(pool: Any, idle: list[Any], pid: int) -> None:
    if os.getpid() != pid:
        return
    for conn in idle:
        with contextlib.suppress(Exception):  # the pool may be closed already
            pool.release(conn)
    idle.clear()
