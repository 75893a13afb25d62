"""Write steps sent with ``WAIT``: what ``RedisLeaseProvider(..., replicas=N)`` adds.

A Redis primary answers a write before its replicas have it; a failover to a
replica that had not received it loses it (two owners of one key, forwards answered 202 and
gone: docs/safety.md, section 4). With ``replicas=N`` every
write step is sent as three commands in one round trip on one connection::

    EVALSHA <step> ...                      the step itself
    SET <prefix>{t}:ack "" PX 1             the fence: a write after the step's, in its slot
    WAIT N <replica_timeout_ms>             replicas that have everything up to the fence

and the step raises :class:`~leaseguard.errors.NotReplicated` when fewer than ``N`` replicas
acknowledged. ``WAIT`` counts the replicas that reached the last write *of its own
connection*, so without the fence a step that wrote nothing (a resend that finds its own
earlier run, a duplicate, a refused claim) would be acknowledged at once, however far behind
the replicas are: its answer may rest on another client's write that no replica has yet. The
fence comes after the step in the primary's one replication stream, so a replica that has it
has every write the step saw or made, whoever made them. ``WAIT`` cannot run inside a script,
hence the pipeline. Read-only steps (``inspect_key``, ``get_lease_owner``,
``pending_signals``, the index reads) are sent alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leaseguard.errors import InvalidLeaseArgument, LeaseBackendError, NotReplicated

if TYPE_CHECKING:
    from .provider import RedisLeaseProvider
    from .scripts import LuaScript

DEFAULT_SOCKET_TIMEOUT_S = 2.0
"""The socket timeout of clients :meth:`RedisLeaseProvider.from_url` builds."""
DEFAULT_REPLICA_TIMEOUT_MS = 500
"""How long a write step waits for ``replicas`` acknowledgements by default (``WAIT``'s
timeout): a replica in the same region acknowledges in about a millisecond, and a step that
fails pays this much before it says so."""
MAX_REPLICA_TIMEOUT_MS = 60_000
MAX_REPLICAS = 100

# Steps that write nothing: sent without WAIT.


def run_replicated(
    provider: RedisLeaseProvider,
    script: LuaScript,
    key: str,
    keys: list[str],
    args: tuple[str | int, ...],
) -> Any:
    """The step, the fence and ``WAIT`` in one round trip; the step's reply, or
    :class:`~leaseguard.errors.NotReplicated` when fewer than ``provider.replicas``
    acknowledged."""
    pipelined = provider.pipelined
    if pipelined is None:
        raise LeaseBackendError("run_replicated needs a provider with replicas")
    fence = keys[0].removesuffix("lease") + "ack"  # the key's hash tag: the same slot
    commands = [
        ("EVALSHA", script.sha, len(keys), *keys, key, *args),
        ("SET", fence, "", "PX", 1),
        ("WAIT", provider.replicas, provider.replica_timeout_ms),
    ]
    import redis

    try:
        replies = pipelined(commands)
        if isinstance(replies[0], redis.exceptions.NoScriptError):
            provider.client.script_load(script.text)
            replies = pipelined(commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
    except redis.exceptions.RedisError as exc:
        raise LeaseBackendError(
            f"Redis {script.name} on {key!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    acknowledged = int(replies[2])
    if acknowledged < provider.replicas:
        raise NotReplicated(
            key, script.name, acknowledged, provider.replicas, provider.replica_timeout_ms
        )
    return replies[0]


def check_replication(
    client: Any, replicas: int, timeout_ms: int, socket_timeout: float | None = None
) -> None:
    """Raise :class:`~leaseguard.errors.InvalidLeaseArgument` unless ``replicas`` and
    ``replica_timeout_ms`` (``timeout_ms``) are in range and the timeout is below the client's
    socket timeout (``socket_timeout`` in seconds, else read from ``client``, which may be
    ``None``). Checked before any I/O."""
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise InvalidLeaseArgument(f"replicas must be an int, got {replicas!r}")
    if not 0 <= replicas <= MAX_REPLICAS:
        raise InvalidLeaseArgument(f"replicas must be 0..{MAX_REPLICAS}, got {replicas}")
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
        raise InvalidLeaseArgument(f"replica_timeout_ms must be an int, got {timeout_ms!r}")
    if not 1 <= timeout_ms <= MAX_REPLICA_TIMEOUT_MS:
        raise InvalidLeaseArgument(
            f"replica_timeout_ms must be 1..{MAX_REPLICA_TIMEOUT_MS}, got {timeout_ms}"
        )
    if not replicas:
        return
    if socket_timeout is None:
        # A standalone client's pool, or a cluster client's nodes manager, keeps its options.
        holder = getattr(client, "connection_pool", None) or getattr(client, "nodes_manager", None)
        options = getattr(holder, "connection_kwargs", None)
        socket_timeout = options.get("socket_timeout") if isinstance(options, dict) else None
    if socket_timeout is not None and timeout_ms >= socket_timeout * 1000:
        raise InvalidLeaseArgument(
            f"replica_timeout_ms ({timeout_ms}) must be below the client's socket timeout "
            f"({socket_timeout * 1000:g} ms): the client would give up on the reply first"
        )
