"""The lease contract and signal queue on Redis: each operation one script run
(:mod:`.scripts`), its reply decoded by :mod:`.codec`; with ``replicas``, each write step sent
with ``WAIT`` by :mod:`.replication`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from leaseguard.errors import (
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseLostError,
    QueueFull,
    extra_required,
)
from leaseguard.protocol.model import DEAD_LIMIT, DEFAULT_MAX_QUEUE, Failure
from leaseguard.providers.base import BaseLeaseProvider, new_nonce
from leaseguard.signals import decode_signal
from leaseguard.types import KeyState, LeaseResult, Signal, now_ms
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES

from .codec import as_text, dead_letters, fence_arg, listed_signals, owning_signal
from .connection import connect
from .direct import direct_calls, pipelined_calls
from .keys import escape_key, key_slot, slot_index_key
from .replication import (
    DEFAULT_REPLICA_TIMEOUT_MS,
    DEFAULT_SOCKET_TIMEOUT_S,
    check_replication,
    run_replicated,
)
from .scripts import (
    ACQUIRE_LUA,
    ACQUIRE_OR_ENQUEUE_LUA,
    ADOPT_LUA,
    CLAIM_SIGNAL_LUA,
    INSPECT_LUA,
    REDRIVE_LUA,
    RELEASE_LUA,
    RENEW_LUA,
    TAKE_SIGNALS_LUA,
    TRANSFER_LUA,
    TRANSFER_TO_NEXT_LUA,
    LuaScript,
)
from .slots import SlotIndexes

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

_KEY_CACHE_SIZE = 4096

_READ_ONLY_STEPS = frozenset({INSPECT_LUA.name})


class RedisLeaseProvider(BaseLeaseProvider):
    """The lease contract and signal queue on redis-py ``Redis`` or ``RedisCluster``.

    >>> provider = RedisLeaseProvider.from_url("redis://localhost:6379/0")  # doctest: +SKIP
    >>> provider.acquire_lease("thread:42", "req-1", 15_000)  # doctest: +SKIP
    LeaseResult(acquired=True, owner='req-1', token=1732880000123456, ...)
    """

    atomic_transfer: ClassVar[bool] = True

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        prefix: str = "lg:",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_queue: int = DEFAULT_MAX_QUEUE,
        replicas: int = 0,
        replica_timeout_ms: int = DEFAULT_REPLICA_TIMEOUT_MS,
        dead_limit: int = DEAD_LIMIT,
    ) -> None:
        """
        Parameters
        ----------
        client : redis.Redis or redis.cluster.RedisCluster
            The client every step is sent with.
        prefix : str
            Prefix of every Redis key (no ``{`` or ``}``).
        max_payload_bytes, max_queue : int
            Bounds of a signal's payload and of a key's queue.
        replicas : int
            ``0`` (the default): a step is answered as soon as the primary ran it. ``N > 0``:
            each write step is followed, in the same round trip, by ``WAIT N
            replica_timeout_ms`` and raises :class:`~leaseguard.errors.NotReplicated` when
            fewer than ``N`` replicas of the primary acknowledged it (the write did apply on
            the primary). See docs/deploy.md for what holds on failover with and without it.
        replica_timeout_ms : int
            How long the primary waits for the acknowledgements, 1 to 60,000 ms; it must be
            below the client's socket timeout, or the client gives up on the reply first.
        dead_limit : int
            Dead letters a key keeps, at most :data:`~leaseguard.protocol.state.DEAD_LIMIT`
            (the default; row G6: past it a failed signal waits at the head and the key halts).

        Raises
        ------
        InvalidLeaseArgument
            An argument is out of range, before any I/O.
        """
        super().__init__(
            max_payload_bytes=max_payload_bytes, max_queue=max_queue, dead_limit=dead_limit
        )
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise InvalidLeaseArgument("prefix must be a str without '{' or '}'")
        check_replication(client, replicas, replica_timeout_ms)
        with extra_required("redis", "the Redis provider"):
            import redis
            from redis.cluster import RedisCluster

        self.client = client
        self.execute: Callable[..., Any] = direct_calls(client) or client.execute_command
        """What every script run is sent with: :class:`~.direct.DirectCalls` for a plain
        standalone client, :class:`~.direct.ClusterCalls` for a plain ``RedisCluster``, else
        the client's ``execute_command``."""
        self.replicas = replicas
        self.replica_timeout_ms = replica_timeout_ms
        self.pipelined = pipelined_calls(client, self.execute) if replicas else None
        """How a write step goes out with its fence and ``WAIT`` (:mod:`.replication`); ``None``
        without ``replicas``."""
        self.prefix = prefix
        self.cluster = isinstance(client, RedisCluster)
        self._slot_indexes = (  # isinstance, not self.cluster: it narrows the client's type
            SlotIndexes(client, prefix) if isinstance(client, RedisCluster) else None
        )
        self._keys: dict[str, list[str]] = {}
        self._redis_error = redis.exceptions.RedisError
        self._no_script = redis.exceptions.NoScriptError

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        prefix: str = "lg:",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_queue: int = DEFAULT_MAX_QUEUE,
        dead_limit: int = DEAD_LIMIT,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT_S,
        replicas: int = 0,
        replica_timeout_ms: int = DEFAULT_REPLICA_TIMEOUT_MS,
        **client_options: Any,
    ) -> RedisLeaseProvider:
        """Build a client from ``redis://``, ``rediss://`` (TLS) or ``unix://`` URLs, with ACL
        credentials as ``redis://user:password@host:port/db``. ``cluster=True`` makes a
        ``RedisCluster`` client that discovers the other nodes from this one. ``replicas`` and
        ``replica_timeout_ms`` are the constructor's (checked before connecting), as are the
        other keywords."""
        check_replication(None, replicas, replica_timeout_ms, socket_timeout)
        client = connect(url, cluster=cluster, socket_timeout=socket_timeout, **client_options)
        return cls(
            client,
            prefix=prefix,
            max_payload_bytes=max_payload_bytes,
            max_queue=max_queue,
            dead_limit=dead_limit,
            replicas=replicas,
            replica_timeout_ms=replica_timeout_ms,
        )

    # -- keys -----------------------------------------------------------------------------------

    def redis_keys(self, key: str) -> list[str]:
        """The Redis keys a script for ``key`` touches, in the scripts' KEYS order."""
        keys = self._keys.get(key)
        if keys is None:
            tag = escape_key(key)
            base = f"{self.prefix}{{{tag}}}"
            slot = key_slot(tag) if self.cluster else 0
            keys = [
                f"{base}:lease",
                f"{base}:queue",
                f"{base}:signals",
                f"{base}:inflight",
                self._index_key(slot),
                f"{base}:done",
                f"{base}:donetok",
                f"{base}:attempts",
                f"{base}:dead",
                f"{base}:state",
                self._index_key(slot, "deadindex"),
            ]
            if len(self._keys) >= _KEY_CACHE_SIZE:
                self._keys.clear()
            self._keys[key] = keys
        return keys

    def _index_key(self, slot: int, name: str = "index") -> str:
        """The orphan index (``index``) or the dead-letter index (``deadindex``) of a slot."""
        if self.cluster:
            return slot_index_key(self.prefix, slot, name)
        return f"{self.prefix}{name}"

    def _run(self, script: LuaScript, key: str, *args: str | int) -> Any:
        keys = self._keys.get(key) or self.redis_keys(key)
        if self.pipelined is not None and script.name not in _READ_ONLY_STEPS:
            return run_replicated(self, script, key, keys, args)
        execute = self.execute  # not Script.__call__: a third of the client-side cost of a call
        try:
            try:
                return execute("EVALSHA", script.sha, len(keys), *keys, key, *args)
            except self._no_script:
                self.client.script_load(script.text)  # Cluster loads it on every primary
                return execute("EVALSHA", script.sha, len(keys), *keys, key, *args)
        except self._redis_error as exc:
            raise LeaseBackendError(
                f"Redis {script.name} on {key!r} failed: {type(exc).__name__}: {exc}"
            ) from exc

    # -- the contract ---------------------------------------------------------------------------

    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        acquired, holder, token = self._run(ACQUIRE_LUA, key, owner, ttl_ms)
        if acquired:  # [L1] [L3] the holder is the caller: no need to decode it
            return LeaseResult(True, owner, int(token))
        return LeaseResult(False, as_text(holder), int(token))

    def _get_owner(self, key: str) -> str | None:
        try:
            holder = self.client.hget(self.redis_keys(key)[0], "o")
        except self._redis_error as exc:
            raise LeaseBackendError(f"Redis read of {key!r} failed: {exc}") from exc
        return None if holder is None else as_text(holder)

    def _release(self, key: str, owner: str) -> None:
        self._run(RELEASE_LUA, key, owner)

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        return bool(self._run(RENEW_LUA, key, owner, ttl_ms, fence_arg(token)))

    def _transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        reply = self._run(TRANSFER_LUA, key, from_owner, to_owner, ttl_ms)
        return bool(reply[0])

    # -- the signal queue -----------------------------------------------------------------------

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        reply = self._run(
            ACQUIRE_OR_ENQUEUE_LUA, key, signal.id, record, ttl_ms, new_nonce(), max_queue
        )
        if reply[0] == 2:  # [Q8]
            raise QueueFull(key, int(reply[2]), max_queue, as_text(reply[1]) or None)
        if reply[0] == 1:
            holder, token = as_text(reply[1]), int(reply[2])
            if len(reply) == 5:  # an orphaned key: `holder`'s signal is adopted
                return LeaseResult(True, holder, token, adopted=owning_signal(reply[1:5]))
            # [Q1] / [Q7] the caller's own signal owns the key: its failed runs so far
            return LeaseResult(True, holder, token, attempts=int(reply[3]))
        # Not acquired: queued, in flight, a second delivery or a duplicate; on a free key (a
        # duplicate) there is no holder and no token.
        holder_text, token_text = as_text(reply[1]), as_text(reply[2])
        return LeaseResult(
            False,
            holder_text or None,
            int(token_text) if token_text else None,
            position=int(reply[3]) or None,
        )

    def _take(
        self,
        key: str,
        owner: str,
        limit: int,
        token: int | None = None,
        completed: tuple[str, ...] = (),
    ) -> list[Signal]:
        reply = self._run(
            TAKE_SIGNALS_LUA, key, owner, limit, new_nonce(), fence_arg(token), *completed
        )
        if reply[0] != 1:
            raise LeaseLostError(key, owner, as_text(reply[1]) or None)
        return listed_signals(reply[1:])

    def _transfer_to_next(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        claim: bool,
        token: int | None = None,
        failure: Failure | None = None,
    ) -> Signal | None:
        if failure is None:
            failed: tuple[str | int, ...] = (0, "", 1, 1, 0, self.dead_limit)
        else:
            failed = (
                1,
                failure.error,
                int(failure.requeue_owner),
                failure.max_attempts,
                int(failure.halt),
                self.dead_limit,
            )
            if failure.completed is not None:  # [G8] a partial report: the ids it names
                failed += (len(failure.completed), *failure.completed, *failure.failed)
        reply = self._run(
            TRANSFER_TO_NEXT_LUA, key, owner, ttl_ms, int(claim), fence_arg(token), *failed
        )
        if reply[0] == 0:
            raise LeaseLostError(key, owner, as_text(reply[1]) or None)
        if reply[0] == 2:
            return None
        return owning_signal(reply[1:5])

    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        reply = self._run(CLAIM_SIGNAL_LUA, key, owner, str(token), ttl_ms, new_nonce())
        if reply[0] != 1:
            return None
        # [C1] the envelope's token; [C4] a new one
        return decode_signal(owner, reply[1], int(reply[3]), int(reply[2]))

    def _pending(self, key: str) -> int:
        try:
            return int(self.client.llen(self.redis_keys(key)[1]))
        except self._redis_error as exc:
            raise LeaseBackendError(f"Redis read of {key!r} failed: {exc}") from exc

    def _adopt(self, ttl_ms: int, limit: int, claim: bool) -> list[tuple[str, Signal]]:
        adopted: list[tuple[str, Signal]] = []
        for key in self._orphan_candidates(limit):
            reply = self._run(ADOPT_LUA, key, ttl_ms, int(claim), new_nonce())
            if reply[0] == 1:
                adopted.append((key, owning_signal(reply[1:5])))
        return adopted

    def _orphan_candidates(self, limit: int) -> list[str]:
        """Keys whose indexed deadline passed. The deadline is a hint: the adopt script checks
        the lease itself, so a client clock a little off only delays or repeats a check."""
        import redis
        from redis.exceptions import RedisClusterException

        now = now_ms()
        try:
            if self._slot_indexes is None:
                found = self.client.zrangebyscore(self._index_key(0), "-inf", now, 0, limit)
            else:
                found = self._slot_indexes.orphans("index", now, limit)
        except (redis.exceptions.RedisError, RedisClusterException) as exc:
            raise LeaseBackendError(f"Redis orphan index read failed: {exc}") from exc
        return [as_text(m) for m in found[:limit]]

    def _inspect(self, key: str) -> KeyState:
        owner, token, pttl, queued, in_flight, dead, halted = self._run(INSPECT_LUA, key)
        live = bool(as_text(owner))
        return KeyState(
            key=key,
            owner=as_text(owner) if live else None,
            token=int(token) if live else None,
            remaining_ms=int(pttl) if live else None,
            queued=tuple(listed_signals(queued)),
            in_flight=tuple(as_text(i) for i in in_flight),
            dead_letters=dead_letters(dead),
            halted=bool(halted),
        )

    # -- dead letters -----------------------------------------------------------------------------

    def _redrive(self, key: str, ids: tuple[str, ...] | None) -> int:
        selection: tuple[str | int, ...] = (1,) if ids is None else (0, *ids)
        # the call's nonce: redis-py's resend of the script carries it, and [V3] knows it
        return int(self._run(REDRIVE_LUA, key, new_nonce(), *selection))

    def _dead_letter_keys(self, limit: int) -> list[str]:
        """From the dead-letter index (members scored 0, so each index lists its keys in byte
        order); on Cluster every slot's index, ``limit`` from each, the first ``limit`` of all."""
        import redis
        from redis.exceptions import RedisClusterException

        try:
            if self._slot_indexes is None:
                found = self.client.zrange(self._index_key(0, "deadindex"), 0, limit - 1)
            else:
                found = self._slot_indexes.members("deadindex", limit)
        except (redis.exceptions.RedisError, RedisClusterException) as exc:
            raise LeaseBackendError(f"Redis dead-letter index read failed: {exc}") from exc
        return sorted(as_text(m) for m in found)[:limit]
