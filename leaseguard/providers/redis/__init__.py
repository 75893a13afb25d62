"""Leases and signal queues on Redis, standalone or Cluster: one round trip per operation.

Every operation is one Lua script (``providers/lua/*.lua``, assembled by :mod:`.scripts`),
registered once and run with EVALSHA; redis-py loads it again on NOSCRIPT. A refused acquire
names the holder from the same script. Expiry is the server's: the lease hash carries
``PEXPIRE``, no client clock is read.

**The protocol.** The scripts implement the rows of the executable model
(:mod:`leaseguard.protocol.model`, which :class:`~leaseguard.providers.memory.InMemoryLeaseProvider`
runs on) one step per script run; each script names the rows it implements. Completed signal ids
are remembered for :data:`~leaseguard.protocol.model.DEDUPE_WINDOW_MS` (at most
:data:`~leaseguard.protocol.model.DONE_LIMIT` per key), failed signals are retried or
dead-lettered, exactly as the model does.

**Connections.** On a plain standalone ``redis.Redis`` the scripts go out on connections the
provider keeps (:mod:`.direct`): one per thread calling at the same moment, taken from the
client's pool once and given back when the provider is collected, each command under the
connection's retry policy. redis-py's ``execute_command`` spends about as much Python per
command as the loopback round trip itself. On a plain ``RedisCluster`` each script goes the same
way to the primary of its keys' slot, and through the client's ``execute_command`` whenever that
primary does not simply answer (a redirection, a failover). Single-connection clients and
subclasses keep ``execute_command``. On Cluster, the per-slot indexes are read by one script run
per primary (:mod:`.slots`).

**Retries.** redis-py resends a command whose connection dropped, also after Redis ran it. Every
script is safe to run twice: a transfer or hand-off finds itself as the previous owner (``p``,
``pt``) or its grant remembered as completed (``done``), a take finds its nonce (``k``), a grant
or claim finds the nonce of the call that made it (``w``) and returns the first run's result;
renew and release are idempotent already, and a redrive finds its nonce in the done memory
(``donetok``) and answers what it moved.

**Replicas.** ``RedisLeaseProvider(client, replicas=N)`` sends every write step with a fence
write and ``WAIT N replica_timeout_ms`` in the same round trip, on the same connection (on
Cluster: to the primary that ran the script), and raises
:class:`~leaseguard.errors.NotReplicated` when fewer than ``N`` replicas acknowledged
(:mod:`.provider`). Without it a failover may lose any acknowledged step (docs/deploy.md).

**Key layout.** For a user key ``k`` and prefix ``lg:`` the keys are ``lg:{t}:lease``,
``lg:{t}:queue``, ``lg:{t}:signals``, ``lg:{t}:inflight``, ``lg:{t}:done``, ``lg:{t}:donetok``,
``lg:{t}:attempts``, ``lg:{t}:dead`` and ``lg:{t}:state`` (see ``lua/_prelude.lua``), where
``t`` is ``k`` with ``%``, ``{`` and ``}`` percent-encoded (``%25``, ``%7B``, ``%7D``). With
``replicas`` there is also ``lg:{t}:ack``, the fence, which expires 1 ms after each write step.
The encoding is injective, so two user keys never share Redis keys, and ``t`` contains no brace,
so the hash tag is exactly ``t`` and all of a key's Redis keys land in one Cluster slot whatever
the user key holds (spaces, newlines, unicode and braces included). Keys with pending signals
are indexed in a sorted set scored by the owner's deadline: ``lg:index`` on a standalone
server, and on Cluster one ``lg:{s}:index`` per slot, where ``s`` is a short string that
hashes to the same slot as the user key, so the index is updated inside the same script. Keys
that hold dead letters are indexed the same way (``lg:deadindex``, on Cluster
``lg:{s}:deadindex``) for :meth:`~leaseguard.providers.base.BaseLeaseProvider.dead_letter_keys`;
a halted key is left out of the orphan index until it is redriven (nothing may be granted from
it).

**Memory.** Every key expires except those that hold work: ``queue``, ``signals``,
``inflight``, ``attempts``, ``state`` and ``dead`` live exactly as long as queued, in-flight
or dead-lettered signals, or the halt, do. The lease hash expires with the lease (300 s after a
release), ``done`` and ``donetok`` 300 s after the last completion (``donetok`` also 300 s after
a grant that names a previous owner), so a key that falls idle leaves nothing behind.

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
read from their copy in the done memory (``donetok``), which a grant naming a previous owner
writes and which lasts at least 300 s after it, and as long as the last completion is remembered,
rather than as long as the model's record (a release writes no copy: the released hash keeps
``p``/``pt`` itself for those 300 s). What must outlive
an expired lease lives in ``state``: the halted flag ``h``, and ``g``, the token of the grant
whose signals are in flight (the model's ``t`` for row C4 after the grant's lease ran out).
"""

from leaseguard.errors import NotReplicated

from .connection import redact_url
from .keys import CLUSTER_SLOTS, escape_key, key_slot, slot_tags
from .provider import RedisLeaseProvider
from .replication import DEFAULT_REPLICA_TIMEOUT_MS
from .scripts import (
    ACL_COMMANDS,
    ACQUIRE_LUA,
    ACQUIRE_OR_ENQUEUE_LUA,
    ADOPT_LUA,
    CLAIM_SIGNAL_LUA,
    INSPECT_LUA,
    REDRIVE_LUA,
    RELEASE_LUA,
    RENEW_LUA,
    REPLICA_ACL_COMMANDS,
    TAKE_SIGNALS_LUA,
    TRANSFER_LUA,
    TRANSFER_TO_NEXT_LUA,
    LuaScript,
)

__all__ = [
    "ACL_COMMANDS",
    "ACQUIRE_LUA",
    "ACQUIRE_OR_ENQUEUE_LUA",
    "ADOPT_LUA",
    "CLAIM_SIGNAL_LUA",
    "CLUSTER_SLOTS",
    "DEFAULT_REPLICA_TIMEOUT_MS",
    "INSPECT_LUA",
    "REDRIVE_LUA",
    "RELEASE_LUA",
    "RENEW_LUA",
    "REPLICA_ACL_COMMANDS",
    "TAKE_SIGNALS_LUA",
    "TRANSFER_LUA",
    "TRANSFER_TO_NEXT_LUA",
    "LuaScript",
    "NotReplicated",
    "RedisLeaseProvider",
    "escape_key",
    "key_slot",
    "redact_url",
    "slot_tags",
]
