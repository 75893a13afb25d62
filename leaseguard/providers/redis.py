"""Leases and signal queues on Redis, standalone or Cluster: one round trip per operation.

Every operation is one Lua script (``providers/lua/*.lua``), registered once and run with
EVALSHA; redis-py loads it again on NOSCRIPT. A refused acquire names the holder from the same
script. Expiry is the server's: the lease hash carries ``PEXPIRE``, no client clock is read.

**The protocol.** The scripts implement the rows of the executable model
(:mod:`leaseguard.protocol.model`, which :class:`~leaseguard.providers.memory.InMemoryLeaseProvider`
runs on) one step per script run; each script names the rows it implements. Completed signal ids
are remembered for :data:`~leaseguard.protocol.model.DEDUPE_WINDOW_MS` (at most
:data:`~leaseguard.protocol.model.DONE_LIMIT` per key), failed signals are retried or
dead-lettered, exactly as the model does.

**Retries.** redis-py resends a command whose connection dropped, also after Redis ran it. Every
script is safe to run twice: a transfer or hand-off finds itself as the previous owner (``p``,
``pt``) or its grant remembered as completed (``done``), a take finds its nonce (``k``), a grant
or claim finds the nonce of the call that made it (``w``) and returns the first run's result;
renew and release are idempotent already, and a resent redrive finds nothing left to move.

**Key layout.** For a user key ``k`` and prefix ``lg:`` the keys are ``lg:{t}:lease``,
``lg:{t}:queue``, ``lg:{t}:signals``, ``lg:{t}:inflight``, ``lg:{t}:done``, ``lg:{t}:donetok``,
``lg:{t}:attempts``, ``lg:{t}:dead`` and ``lg:{t}:state`` (see ``lua/_prelude.lua``), where
``t`` is ``k`` with ``%``, ``{`` and ``}`` percent-encoded (``%25``, ``%7B``, ``%7D``). The
encoding is injective, so two user keys never share Redis keys, and ``t`` contains no brace, so
the hash tag is exactly ``t`` and all of a key's Redis keys land in one Cluster slot whatever
the user key holds (spaces, newlines, unicode and braces included). Keys with pending signals
are indexed in a sorted set scored by the owner's deadline: ``lg:index`` on a standalone
server, and on Cluster one ``lg:{s}:index`` per slot, where ``s`` is a short string that
hashes to the same slot as the user key, so the index is updated inside the same script. Keys
that hold dead letters are indexed the same way (``lg:deadindex``, on Cluster
``lg:{s}:deadindex``) for :meth:`~leaseguard.providers.base.BaseLeaseProvider.dead_letter_keys`;
a halted key is left out of the orphan index until it is redriven (nothing may be granted from
it).

**Fencing tokens** are ``max(last token + 1, server clock in µs)`` (``TIME`` inside the
script). The last token lives in the lease hash while the lease lives and for 300 s after a
release (as long as the released owner is remembered as done); once the hash is gone (expired,
or lost in a restart without persistence) the server clock alone is above every token issued
before. Assumptions: the server's clock does not step back by more than that (a failover
promotes a replica whose clock is NTP-synced), and a key changes owner less than once per
microsecond (each change is a separate script run).

**Where Redis differs from the model.** The model keeps a key's record after its owner's lease
*expired*; Redis expires the whole lease hash with the lease. The token after an expiry then
comes from the clock alone (higher, never lower: only the values differ), and ``p``/``pt`` are
read from their copy in the done memory (``donetok``), which lasts as long as the last
completion is remembered (300 s) rather than as long as the model's record. What must outlive
an expired lease lives in ``state``: the halted flag ``h``, and ``g``, the token of the grant
whose signals are in flight (the model's ``t`` for row C4 after the grant's lease ran out).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
import uuid
from binascii import crc_hqx
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar

from leaseguard.errors import InvalidLeaseArgument, LeaseBackendError, LeaseLostError, QueueFull
from leaseguard.protocol.model import (
    DEDUPE_WINDOW_MS,
    DEFAULT_MAX_QUEUE,
    DONE_LIMIT,
    TOKEN_MEMORY_MS,
    Failure,
)
from leaseguard.signals import decode_signal
from leaseguard.types import DeadLetter, KeyState, LeaseResult, Signal
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES

from .base import BaseLeaseProvider

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

CLUSTER_SLOTS = 16384


@dataclass(frozen=True)
class LuaScript:
    """A script's text and SHA1, computed once at import; run by EVALSHA."""

    name: str
    text: str
    sha: str


# The model's constants, defined above the prelude of every script (one source of truth).
_CONSTANTS = (
    f"local DEDUPE_WINDOW_MS, DONE_LIMIT, TOKEN_MEMORY_MS = "
    f"{DEDUPE_WINDOW_MS}, {DONE_LIMIT}, {TOKEN_MEMORY_MS}\n"
)


def _lua(name: str) -> LuaScript:
    package = resources.files("leaseguard.providers") / "lua"
    prelude = (package / "_prelude.lua").read_text(encoding="utf-8")
    text = _CONSTANTS + prelude + "\n" + (package / f"{name}.lua").read_text(encoding="utf-8")
    return LuaScript(name, text, hashlib.sha1(text.encode("utf-8")).hexdigest())


ACQUIRE_LUA = _lua("acquire")
RENEW_LUA = _lua("renew")
RELEASE_LUA = _lua("release")
TRANSFER_LUA = _lua("transfer")
ACQUIRE_OR_ENQUEUE_LUA = _lua("acquire_or_enqueue")
TAKE_SIGNALS_LUA = _lua("take_signals")
TRANSFER_TO_NEXT_LUA = _lua("transfer_to_next")
CLAIM_SIGNAL_LUA = _lua("claim_signal")
ADOPT_LUA = _lua("adopt")
INSPECT_LUA = _lua("inspect")
REDRIVE_LUA = _lua("redrive")
_KEY_CACHE_SIZE = 4096

_SCRIPTS = (
    ACQUIRE_LUA,
    RENEW_LUA,
    RELEASE_LUA,
    TRANSFER_LUA,
    ACQUIRE_OR_ENQUEUE_LUA,
    TAKE_SIGNALS_LUA,
    TRANSFER_TO_NEXT_LUA,
    CLAIM_SIGNAL_LUA,
    ADOPT_LUA,
    INSPECT_LUA,
    REDRIVE_LUA,
)

ACL_COMMANDS: tuple[str, ...] = tuple(
    sorted(
        {"evalsha", "script|load", "hget", "llen", "zrange", "zrangebyscore"}
        | {m.lower() for lua in _SCRIPTS for m in re.findall(r"redis\.call\('(\w+)'", lua.text)}
    )
)
"""Every command leaseguard sends or runs inside its scripts (which run with the caller's ACL
permissions): a least-privilege Redis user needs exactly these, on keys ``<prefix>*``::

    ACL SETUSER lease-app on >password ~lg:* resetchannels -@all +<each command>
"""


def escape_key(key: str) -> str:
    """The hash-tag form of a user key (see the module docstring)."""
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


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


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
    ) -> None:
        super().__init__(max_payload_bytes=max_payload_bytes, max_queue=max_queue)
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise InvalidLeaseArgument("prefix must be a str without '{' or '}'")
        import redis
        from redis.cluster import RedisCluster

        self.client = client
        self.prefix = prefix
        self.cluster = isinstance(client, RedisCluster)
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
        socket_timeout: float = 2.0,
        **client_options: Any,
    ) -> RedisLeaseProvider:
        """Build a client from ``redis://``, ``rediss://`` (TLS) or ``unix://`` URLs, with ACL
        credentials as ``redis://user:password@host:port/db``. ``cluster=True`` makes a
        ``RedisCluster`` client that discovers the other nodes from this one."""
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise InvalidLeaseArgument("url must start with redis://, rediss:// or unix://")
        import redis
        from redis.backoff import ExponentialWithJitterBackoff
        from redis.cluster import RedisCluster
        from redis.retry import Retry

        options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_timeout,
            # redis-py's default (10 retries, backoff up to 1 s) would hold a renewal far past
            # a typical TTL; every script is safe to resend after an ambiguous failure.
            "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), 3),
            **client_options,
        }
        try:
            client: Redis | RedisCluster
            if cluster:
                client = RedisCluster.from_url(url, **options)
            else:
                client = redis.Redis.from_url(url, **options)
        except redis.exceptions.RedisError as exc:
            raise LeaseBackendError(f"cannot connect to Redis at {_redact(url)}: {exc}") from exc
        return cls(client, prefix=prefix, max_payload_bytes=max_payload_bytes, max_queue=max_queue)

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
            return f"{self.prefix}{{{slot_tags()[slot]}}}:{name}"
        return f"{self.prefix}{name}"

    def _run(self, script: LuaScript, key: str, *args: str | int) -> Any:
        keys = self.redis_keys(key)
        command = ("EVALSHA", script.sha, len(keys), *keys, key, *args)
        # execute_command, not Script.__call__: a third of the client-side cost of a call
        execute: Callable[..., Any] = self.client.execute_command
        try:
            try:
                return execute(*command)
            except self._no_script:
                self.client.script_load(script.text)  # Cluster loads it on every primary
                return execute(*command)
        except self._redis_error as exc:
            raise LeaseBackendError(
                f"Redis {script.name} on {key!r} failed: {type(exc).__name__}: {exc}"
            ) from exc

    # -- the contract ---------------------------------------------------------------------------

    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        acquired, holder, token = self._run(ACQUIRE_LUA, key, owner, ttl_ms)
        return LeaseResult(bool(acquired), _text(holder), int(token))

    def _get_owner(self, key: str) -> str | None:
        try:
            holder = self.client.hget(self.redis_keys(key)[0], "o")
        except self._redis_error as exc:
            raise LeaseBackendError(f"Redis read of {key!r} failed: {exc}") from exc
        return None if holder is None else _text(holder)

    def _release(self, key: str, owner: str) -> None:
        self._run(RELEASE_LUA, key, owner)

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        return bool(self._run(RENEW_LUA, key, owner, ttl_ms, _fence(token)))

    def _transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        reply = self._run(TRANSFER_LUA, key, from_owner, to_owner, ttl_ms)
        return bool(reply[0])

    # -- the signal queue -----------------------------------------------------------------------

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        reply = self._run(
            ACQUIRE_OR_ENQUEUE_LUA, key, signal.id, record, ttl_ms, _nonce(), max_queue
        )
        if reply[0] == 2:  # [Q8]
            raise QueueFull(key, int(reply[2]), max_queue, _text(reply[1]) or None)
        if reply[0] == 1:
            holder, token = _text(reply[1]), int(reply[2])
            if len(reply) == 5:  # an orphaned key: `holder`'s signal is adopted
                return LeaseResult(True, holder, token, adopted=_signal(reply[1:5]))
            # [Q1] / [Q7] the caller's own signal owns the key: its failed runs so far
            return LeaseResult(True, holder, token, attempts=int(reply[3]))
        # Not acquired: queued, in flight, a second delivery or a duplicate; on a free key (a
        # duplicate) there is no holder and no token.
        holder_text, token_text = _text(reply[1]), _text(reply[2])
        return LeaseResult(
            False,
            holder_text or None,
            int(token_text) if token_text else None,
            position=int(reply[3]) or None,
        )

    def _take(self, key: str, owner: str, limit: int, token: int | None = None) -> list[Signal]:
        reply = self._run(TAKE_SIGNALS_LUA, key, owner, limit, _nonce(), _fence(token))
        if reply[0] != 1:
            raise LeaseLostError(key, owner, _text(reply[1]) or None)
        return _signals(reply[1:])

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
            failed: tuple[str | int, ...] = (0, "", 1, 1, 0)
        else:
            failed = (
                1,
                failure.error,
                int(failure.requeue_owner),
                failure.max_attempts,
                int(failure.halt),
            )
        reply = self._run(
            TRANSFER_TO_NEXT_LUA, key, owner, ttl_ms, int(claim), _fence(token), *failed
        )
        if reply[0] == 0:
            raise LeaseLostError(key, owner, _text(reply[1]) or None)
        if reply[0] == 2:
            return None
        return _signal(reply[1:5])

    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        reply = self._run(CLAIM_SIGNAL_LUA, key, owner, str(token), ttl_ms, _nonce())
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
            reply = self._run(ADOPT_LUA, key, ttl_ms, int(claim), _nonce())
            if reply[0] == 1:
                adopted.append((key, _signal(reply[1:5])))
        return adopted

    def _orphan_candidates(self, limit: int) -> list[str]:
        """Keys whose indexed deadline passed. The deadline is a hint: the adopt script checks
        the lease itself, so a client clock a little off only delays or repeats a check."""
        import redis

        now = time.time_ns() // 1_000_000
        try:
            if not self.cluster:
                found = self.client.zrangebyscore(self._index_key(0), "-inf", now, 0, limit)
            else:
                pipe = self.client.pipeline(transaction=False)
                for slot in range(CLUSTER_SLOTS):
                    pipe.zrangebyscore(self._index_key(slot), "-inf", now, 0, limit)
                found = [member for batch in pipe.execute() for member in batch]
        except redis.exceptions.RedisError as exc:
            raise LeaseBackendError(f"Redis orphan index read failed: {exc}") from exc
        return [_text(m) for m in found[:limit]]

    def _inspect(self, key: str) -> KeyState:
        owner, token, pttl, queued, in_flight, dead, halted = self._run(INSPECT_LUA, key)
        live = bool(_text(owner))
        return KeyState(
            key=key,
            owner=_text(owner) if live else None,
            token=int(token) if live else None,
            remaining_ms=int(pttl) if live else None,
            queued=tuple(_signals(queued)),
            in_flight=tuple(_text(i) for i in in_flight),
            dead_letters=_dead_letters(dead),
            halted=bool(halted),
        )

    # -- dead letters -----------------------------------------------------------------------------

    def _redrive(self, key: str, ids: tuple[str, ...] | None) -> int:
        selection: tuple[str | int, ...] = (1,) if ids is None else (0, *ids)
        return int(self._run(REDRIVE_LUA, key, *selection))

    def _dead_letter_keys(self, limit: int) -> list[str]:
        """From the dead-letter index (members scored 0, so each index lists its keys in byte
        order); on Cluster every slot's index, ``limit`` from each, the first ``limit`` of all."""
        import redis

        try:
            if not self.cluster:
                found = self.client.zrange(self._index_key(0, "deadindex"), 0, limit - 1)
            else:
                pipe = self.client.pipeline(transaction=False)
                for slot in range(CLUSTER_SLOTS):
                    pipe.zrange(self._index_key(slot, "deadindex"), 0, limit - 1)
                found = [member for batch in pipe.execute() for member in batch]
        except redis.exceptions.RedisError as exc:
            raise LeaseBackendError(f"Redis dead-letter index read failed: {exc}") from exc
        return sorted(_text(m) for m in found)[:limit]


def _signal(reply: list[Any]) -> Signal:
    """``[id, token, stored, attempts]`` from a script: the signal that owns the key."""
    signal_id, token, stored, attempts = reply
    return decode_signal(_text(signal_id), stored, int(token), int(attempts))


def _signals(flat: list[Any]) -> list[Signal]:
    """``[id, stored, attempts, ...]`` from a script: queued or taken signals (no token)."""
    return [
        decode_signal(_text(i), s, None, int(a))
        for i, s, a in zip(flat[::3], flat[1::3], flat[2::3], strict=True)
    ]


def _dead_letters(flat: list[Any]) -> tuple[DeadLetter, ...]:
    """``[id, entry, ...]`` (HGETALL of the dead hash) in the order they were dead-lettered."""
    entries = sorted(
        ((_text(i), json.loads(e)) for i, e in zip(flat[::2], flat[1::2], strict=True)),
        key=lambda item: int(item[1]["n"]),
    )
    letters = []
    for signal_id, entry in entries:
        signal = decode_signal(signal_id, entry["r"])
        letters.append(
            DeadLetter(
                id=signal_id,
                payload=signal.payload,
                attempts=int(entry["a"]),
                error=str(entry["e"]),
                enqueued_at_ms=signal.enqueued_at_ms,
                failed_at_ms=int(entry["at"]),
            )
        )
    return tuple(letters)


def _nonce() -> str:
    """Names one call: redis-py resends a command whose reply was lost (a dropped connection
    after Redis ran it), and a script that finds its own nonce returns what it did the first
    time instead of taking its own effect for someone else's."""
    return uuid.uuid4().hex


def _fence(token: int | None) -> str:
    """The token argument of the owner-side scripts: ``''`` accepts any grant of the owner."""
    return "" if token is None else str(token)


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest
