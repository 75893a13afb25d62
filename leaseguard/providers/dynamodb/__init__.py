"""Leases and signal queues on DynamoDB: one conditional ``UpdateItem`` per lease operation.

**Requests.** ``acquire_lease``, ``renew_lease``, ``release_lease`` and ``transfer_lease`` are
each one conditional ``UpdateItem``. A refused acquire names the holder from the same request
(``ReturnValuesOnConditionCheckFailure=ALL_OLD``); a failed condition is a normal result, never
an exception. Two documented exceptions: an acquire by the *current* owner (which must keep its
token, and a single update expression cannot both keep and raise it) sends a second, conditional
refresh after the first write's ``ALL_OLD`` showed the caller already holds the key; and a
release or transfer of a lease that carried in-flight signals completes them ([G6]) with a
second write conditional on the first refusal's snapshot, then deletes those of their payloads
that have payload items (one ``BatchWriteItem`` per 25); only keys used through the signal
queue have any. A guarded invocation with a small event is two requests, uncontended or
forwarded: the grant or the append stores the event inline, and the completion removes it.

**Items.** One table, key ``pk`` (S) + ``sk`` (S), all of a key's items in one partition:

* the lease item, ``pk=<key>``, ``sk="lease"``: ``o`` owner, ``e`` expiry (epoch ms, caller's
  clock), ``t`` fencing token, ``c`` claimed, ``p``/``pt`` the owner that handed over or released
  last and its token, ``w`` the grant nonce (written only by the call that made or claimed the
  grant: [Q1] [Q6] [D1] [C1]), ``v`` the version (a fresh nonce on every write except appends,
  renewals and index moves; snapshot-based writes are conditional on it), ``k``/``kn`` nonce and
  size of the owner's last take, ``q``/``qn`` queued signal ids and their payload refs (parallel
  lists, FIFO), ``f``/``fn`` the same for signals in flight, ``a`` failed-attempt counts of
  stored signals (sparse map), ``d`` the completed-id memory ([G2] [G6]: batches of ids, each
  ended by a marker ``±(at * 10**20 + token)``), ``x``/``xn`` dead-lettered ids and their
  payload refs, ``h`` halted (present only while halted: [G6] sets it under
  ``on_poison="halt"``, [V1] removes it), ``ttl`` (epoch seconds), ``gp``/``gx`` for the orphan
  index and ``gd`` for the dead-letter index;
* a payload ref is *inline* or names payload items. An inline ref is ``=`` followed by the
  signal's :func:`~leaseguard.signals.encode_signal` record (``INLINE``): the record is stored by
  the very write that lists the ref (the [Q1] grant, the [Q2] append: no request of its own, and
  a refused write stores nothing), travels with it through every write that moves refs (take,
  hand-off, requeue, adoption) and leaves with the write that removes the ref (the [G6]
  completion's ``REMOVE`` of ``fn``). A record is inline only while the lease item stays within
  ``INLINE_ITEM_BYTES`` (1 KB: one write unit, so no renewal costs more for it): the blind grant
  judges from what it writes (key, id, record) plus room for what it cannot see, every other
  write from the snapshot it works from (the refused grant's ``ALL_OLD``). Dead letters are
  never inline: dead-lettering writes the record, with the error, attempts and time, to a
  payload item of its own, before the completion lists it;
* otherwise one payload item per signal, ``sk="sig#<ref>"`` with a random ``ref``, holding ``i``
  (signal id), ``r`` (:func:`~leaseguard.signals.encode_signal` text), ``ttl``, and for a dead
  letter ``de``/``da``/``df`` (error, attempts, when). Larger payloads live outside the lease
  item so a renewal stays one write unit; the random ref means deleting a completed payload can
  never delete a later signal that reused the same id. Only a completing owner deletes payloads (the
  ones its write removed from the lease item); an enqueuer never does, since a write of its own
  may still be applied after its reply was lost: unreferenced payloads are reaped by their TTL.
  A record too large for one item (over ``ITEM_RECORD_BYTES``, ~392 KiB) is split: its ref is
  ``<random>.<n>``, the head item holds the first piece as ``r`` and ``sig#<ref>#1`` ...
  ``sig#<ref>#<n-1>`` the others (each with ``i`` and the same ``ttl``). All are written (with
  ``BatchWriteItem``) before the lease write that references the ref, read in the same
  ``BatchGetItem`` as other payloads and joined, renewed and deleted together; a payload with
  any item gone counts as gone.

**Fencing tokens** are ``SET t = if_not_exists(t, :floor) + 1`` where ``:floor`` is the
caller's clock in microseconds. A release updates the item (it never deletes it), so the token
survives release and expiry and simply counts up. The item is only deleted by DynamoDB's TTL,
``retention_s`` (default 7 days) after the lease's last expiry; a key recreated after that starts
from the caller's clock, which is then above every token issued before, provided (1) callers'
clocks are within ``retention_s`` of each other (they are within ``clock_skew_ms``, far less), and
(2) a key did not change owner more than once per microsecond of its life (every change is a
separate write to one item, which DynamoDB serialises at far less than a million per second).

**Expiry and clocks.** There is no server clock in a condition expression, so each request
carries the caller's time; TTL deletion is late (hours to days) and never relied on. The owner
side (renew, transfer, take, hand-off, release) needs ``e > now``; anyone else may take the key
only once ``e + clock_skew_ms < now`` on their clock. With callers' clocks within
``clock_skew_ms`` of each other (Lambda hosts are NTP-synced: milliseconds), a lease is never
taken over before its owner's own clock says it expired. Between the two the key is in limbo:
the owner has lost it, nobody else can have it yet, and :meth:`get_lease_owner` still names it.

**Orphans.** ``gp``/``gx`` are the key attributes of a sparse GSI (``orphans``, keys only): ``gp``
is set (to one of ``orphan_shards`` values, so no index partition runs hot) while the key may
have signals queued or in flight, and ``gx`` is the owner's deadline when it was last written
(0 after a release). :meth:`adopt_orphans` queries ``gx < now - clock_skew_ms`` in each shard and
re-checks every candidate with a consistent read and a conditional write. Renewals do not move
``gx`` (that would add an index write to every renewal); a candidate whose owner renewed is
re-indexed when the sweep meets it. A halted key leaves the index ([N1] with ``h``; a sweep
that meets one anyway removes it, [D4]); a redrive ([V1]) puts it back.

**Dead letters.** ``gd`` is the key of a second sparse GSI (``dead_letters``, keys only), set
to one of ``orphan_shards`` values by the write that dead-letters a signal and removed by the
redrive that moves the last one: :meth:`dead_letter_keys` queries it, never a Scan.

**Backpressure.** A forward that would be queued behind ``max_queue`` others is refused
([Q8], :class:`~leaseguard.errors.QueueFull`): the append is conditional on the queue's size,
and the refused call deletes the payload item it wrote, if any (the refusal shows that no write
of the call references it; an inline record was never stored).

**Retries.** botocore retries throttling, 5xx, timeouts and connection errors (standard mode,
4 attempts in all by default); what still fails is :class:`~leaseguard.errors.LeaseBackendError`.
A resent write whose first attempt was applied fails its own condition; the ``ALL_OLD`` image
then shows its version ``v`` (nobody wrote since), its grant nonce ``w`` ([Q7] [D3]: appends in
between do not touch it), its take nonce ``k`` ([K2]), its appended entry ([Q3]: the resent
append refused on its own id, so an inline record is stored once), ``p``/``pt``
or the completed-id memory ([N4] [T3]), and the call reports the applied result. Every
condition and update expression is a constant in :mod:`.expressions` that names the row of
:mod:`leaseguard.protocol.model` it implements.
"""

# The package's modules load on first use of a name below: leaseguard.config reads
# DEFAULT_CLOCK_SKEW_MS from .schema without loading the provider and its steps.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .done import DONE_BYTES, DONE_STORED_BYTES
    from .provider import DynamoDBLeaseProvider
    from .schema import (
        DEAD_LETTER_INDEX,
        DEFAULT_CLOCK_SKEW_MS,
        DEFAULT_MAX_ATTEMPTS,
        DEFAULT_ORPHAN_SHARDS,
        DEFAULT_RETENTION_S,
        DYNAMODB_MAX_PAYLOAD_BYTES,
        INLINE,
        INLINE_ITEM_BYTES,
        ITEM_RECORD_BYTES,
        LEASE_SK,
        ORPHAN_INDEX,
        SIGNAL_SK_PREFIX,
    )

__all__ = [
    "DEAD_LETTER_INDEX",
    "DEFAULT_CLOCK_SKEW_MS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_ORPHAN_SHARDS",
    "DEFAULT_RETENTION_S",
    "DONE_BYTES",
    "DONE_STORED_BYTES",
    "DYNAMODB_MAX_PAYLOAD_BYTES",
    "INLINE",
    "INLINE_ITEM_BYTES",
    "ITEM_RECORD_BYTES",
    "LEASE_SK",
    "ORPHAN_INDEX",
    "SIGNAL_SK_PREFIX",
    "DynamoDBLeaseProvider",
]

_MODULES = {
    **dict.fromkeys(
        (
            "DEAD_LETTER_INDEX",
            "DEFAULT_CLOCK_SKEW_MS",
            "DEFAULT_MAX_ATTEMPTS",
            "DEFAULT_ORPHAN_SHARDS",
            "DEFAULT_RETENTION_S",
            "DYNAMODB_MAX_PAYLOAD_BYTES",
            "INLINE",
            "INLINE_ITEM_BYTES",
            "ITEM_RECORD_BYTES",
            "LEASE_SK",
            "ORPHAN_INDEX",
            "SIGNAL_SK_PREFIX",
        ),
        "schema",
    ),
    "DONE_BYTES": "done",
    "DONE_STORED_BYTES": "done",
    "DynamoDBLeaseProvider": "provider",
}

# Hidden from type checkers, which see the imports above: with a module __getattr__ in view,
# mypy would accept any misspelt name as an ``object``.
if not TYPE_CHECKING:
    from leaseguard.lazy import module_getattr

    __getattr__ = module_getattr(__name__, _MODULES, globals())
    del module_getattr


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
