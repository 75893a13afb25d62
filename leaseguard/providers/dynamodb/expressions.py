"""Every ConditionExpression and UpdateExpression the DynamoDB provider sends, by protocol row.

Each constant names the row of ``docs/protocol.md`` (and :mod:`leaseguard.protocol.model`) it
implements, as the Lua scripts do. ``:now`` is the caller's clock and ``:cutoff`` is ``now -
clock_skew_ms``: a lease is its owner's while ``e > now`` and anyone's once ``e < cutoff``.

Writes conditional on a snapshot pin it with ``{version}`` (:data:`VERSION_ABSENT` or
:data:`VERSION_IS`) and, where appends since the snapshot would be lost, ``{queue}``
(:data:`QUEUE_EMPTY` or :data:`QUEUE_SIZE_IS`): those templates are filled with
``str.format``. A few expressions name list elements by index (which ids to forget or take, how
far to prune); they are templates too, with the element pattern beside them. The [G6]
completion combines one clause set per outcome (what it completes, dead-letters, halts, and
what follows), each a constant below, into ``COMPLETE_UPDATE``.
"""

from __future__ import annotations

# -- shared conditions --------------------------------------------------------------------------

# the owner side: :me holds the lease by its own clock
LIVE_OWNER = "#o = :me AND #e > :now"
# anyone else: nobody holds it, or its deadline passed clock_skew_ms ago by the caller's clock
TAKEOVER = "(attribute_not_exists(#o) OR #e < :cutoff)"
# free as far as :me is concerned: nobody holds it, or it is :me's own lease that ran out
FREE_FOR_ME = "(attribute_not_exists(#o) OR #e < :cutoff OR (#o = :me AND #e <= :now))"
NOTHING_IN_FLIGHT = "(attribute_not_exists(#f) OR size(#f) = :zero)"
QUEUE_EMPTY = "(attribute_not_exists(#q) OR size(#q) = :zero)"
NOTHING_PENDING = f"{QUEUE_EMPTY} AND {NOTHING_IN_FLIGHT}"
# the snapshot's version ``v`` (absent on an item no versioned write touched yet)
VERSION_ABSENT = "attribute_not_exists(#v)"
VERSION_IS = "#v = :was"
# no append since the snapshot (appends do not change the version)
QUEUE_SIZE_IS = "size(#q) = :nq"
# a payload item that TTL has not deleted
PAYLOAD_EXISTS = "attribute_exists(#r)"

# -- the lease contract -------------------------------------------------------------------------

# [L3] a free key (or the caller's own expired lease) with nothing in flight: [G3] a new grant,
# no grant nonce. A dead owner's in-flight signals refuse it ([G5] needs their ids).
ACQUIRE_UPDATE = (
    "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one,"
    " #c = :true, #v = :v, #ttl = :ttl REMOVE #p, #pt, #w, #k, #kn"
)
ACQUIRE_CONDITION = f"{FREE_FOR_ME} AND {NOTHING_IN_FLIGHT}"

# [L3] with a dead owner's signals in flight: [G5] they go back to the head of the queue (one
# more attempt each) and [G3] the new grant; pinned to the snapshot, appends allowed.
TAKE_OVER_UPDATE = (
    "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one, #c = :true,"
    " #v = :v, #ttl = :ttl, #a = :a,"
    " #q = list_append(:rq, if_not_exists(#q, :empty)),"
    " #qn = list_append(:rqn, if_not_exists(#qn, :empty))"
    " REMOVE #p, #pt, #w, #k, #kn, #f, #fn"
)
TAKE_OVER_CONDITION = "{version} AND " + FREE_FOR_ME

# [L1] the owner acquiring again: a new deadline, the same token (the grant it holds: :grant)
# [R1] the holder (of exactly this grant, with :grant) extends; [R2] never an expired one.
# A deadline is absolute (the sender's clock plus the TTL), so an extension also records when
# it was sent (es) and under which grant (et): one that arrives after an extension of the same
# grant sent later (a slow network; a request applied after its client gave up) is refused,
# where it would move the deadline back under an owner that counts on the later one. Of two
# sent in the same millisecond the later deadline stands (a botocore resend, the same request,
# still applies).
EXTEND_UPDATE = "SET #e = :exp, #ttl = :ttl, #es = :now, #et = #t"
IN_SEND_ORDER = (
    "(attribute_not_exists(#es) OR #et <> #t OR #es < :now OR (#es = :now AND #e <= :exp))"
)
RENEW_CONDITION = f"{LIVE_OWNER} AND {IN_SEND_ORDER}"
RENEW_GRANT_CONDITION = f"{LIVE_OWNER} AND #t = :grant AND {IN_SEND_ORDER}"

# [L4] [T1] the live owner with nothing in flight: [G6] has nothing to complete
IDLE_OWNER = f"{LIVE_OWNER} AND {NOTHING_IN_FLIGHT}"
# [L4] then [G7] free; the queue, if any, stays for the sweeper (gx = 0)
RELEASE_UPDATE = (
    "SET #p = :me, #pt = #t, #v = :v, #gx = :zero, #ttl = :ttl REMOVE #o, #c, #w, #k, #kn"
)
# [T1] then [G3] the grant to :to (nonce None, prev = :me)
TRANSFER_UPDATE = (
    "SET #o = :to, #e = :exp, #t = #t + :one, #c = :true, #p = :me, #pt = #t,"
    " #v = :v, #ttl = :ttl REMOVE #w, #k, #kn"
)

# -- acquire_or_enqueue -------------------------------------------------------------------------

# [Q1] free, nothing queued or in flight, not halted, :me neither completed, nor a failed run
# to resume (:tag), nor dead-lettered: :me owns the key and stays in flight
GRANT_FREE_UPDATE = (
    "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one,"
    " #c = :true, #w = :w, #v = :v, #f = :f, #fn = :fn, #gp = :shard, #gx = :exp,"
    " #ttl = :ttl REMOVE #p, #pt, #k, #kn, #a"
)
GRANT_FREE_CONDITION = (
    f"{TAKEOVER} AND {NOTHING_PENDING} AND attribute_not_exists(#h)"
    " AND NOT contains(#d, :me) AND NOT contains(#d, :tag)"
    " AND NOT contains(#x, :me) AND (attribute_not_exists(#x) OR size(#x) < :xfew)"
)
# [Q1] when the blind grant refused for the dead letters alone (:xfew or more, so the item's
# room is judged first, on the snapshot): the same grant, pinned to that snapshot
GRANT_PINNED_UPDATE = GRANT_FREE_UPDATE
# [Q1] for a retry of an own event whose run failed: its attempts (:a) resume the count;
# pinned to the snapshot that showed them
GRANT_RESUMED_UPDATE = (
    "SET #o = :me, #e = :exp, #t = if_not_exists(#t, :floor) + :one,"
    " #c = :true, #w = :w, #v = :v, #f = :f, #fn = :fn, #gp = :shard, #gx = :exp,"
    " #ttl = :ttl, #a = :a REMOVE #p, #pt, #k, #kn"
)
GRANT_RESUMED_CONDITION = (
    "{version} AND {queue} AND "
    f"{TAKEOVER} AND {NOTHING_PENDING}"
    " AND attribute_not_exists(#h) AND NOT contains(#d, :me)"
    " AND NOT contains(#x, :me)"
)

# [G2] forget entries of :me that no longer deduplicate it, each only if still at its index:
# REMOVE #d[i], ... where #d[i] = :me (or :tag), ...
FORGET_UPDATE = "REMOVE {elements}"
DONE_ELEMENT = "#d[{index}]"
DONE_ELEMENT_IS = "#d[{index}] = {value}"

# [Q2] held by another (also in limbo); [Q9] free (also not in limbo), halted, nothing in flight
HELD_BY_ANOTHER = "attribute_exists(#o) AND #o <> :me AND #e >= :cutoff"
FREE_AND_HALTED = f"attribute_exists(#h) AND {TAKEOVER} AND {NOTHING_IN_FLIGHT}"
# [Q3] [Q5] not stored, not remembered as completed, not dead-lettered; [Q8] below the bound
NEW_WITH_ROOM = (
    "(attribute_not_exists(#q) OR size(#q) < :max)"
    " AND NOT contains(#q, :me) AND NOT contains(#f, :me)"
    " AND NOT contains(#d, :me) AND NOT contains(#x, :me)"
)
# a blind append refuses on a failed run's tag: that retry needs the snapshot-based append
NO_RESUME_TAG = "NOT contains(#d, :tag)"
APPEND = (
    "SET #q = list_append(if_not_exists(#q, :empty), :id),"
    " #qn = list_append(if_not_exists(#qn, :empty), :ref)"
)
# [Q2] appended behind the holder; the key is indexed at the holder's deadline
APPEND_UPDATE = f"{APPEND}, #gp = :shard, #gx = #e"
APPEND_CONDITION = f"{HELD_BY_ANOTHER} AND {NEW_WITH_ROOM} AND {NO_RESUME_TAG}"
# [Q2] a resumed retry: its attempts written with the append, pinned to the snapshot
APPEND_RESUMED_UPDATE = f"{APPEND_UPDATE}, #a = :a, #v = :v"
APPEND_RESUMED_CONDITION = f"{HELD_BY_ANOTHER} AND {NEW_WITH_ROOM}" + " AND {version} AND {queue}"
# [Q9] queued on a free, halted key, which stays out of the orphan index
APPEND_HALTED_UPDATE = APPEND
APPEND_HALTED_CONDITION = f"{FREE_AND_HALTED} AND {NEW_WITH_ROOM} AND {NO_RESUME_TAG}"
APPEND_HALTED_RESUMED_UPDATE = f"{APPEND}, #a = :a, #v = :v"
APPEND_HALTED_RESUMED_CONDITION = (
    f"{FREE_AND_HALTED} AND {NEW_WITH_ROOM}" + " AND {version} AND {queue}"
)

# [Q9] a free, halted key with signals in flight: [G5] they go back to the head (the queue is
# rewritten whole: :q), the caller behind everything; nothing is granted
REQUEUE_HALTED_UPDATE = "SET #q = :q, #qn = :qn, #a = :a, #v = :v REMOVE #f, #fn, #k, #kn"
REQUEUE_HALTED_CONDITION = "{version} AND {queue} AND " + TAKEOVER + " AND attribute_exists(#h)"

# -- take_signals, transfer_to_next, release, transfer ------------------------------------------

# [K1] the first n of the queue move to the owner's in-flight list (REMOVE #q[i], #qn[i] for
# i < n); only the owner removes from the head, under its token, so an unchanged head means
# unchanged first n entries; appends at the tail do not conflict
TAKE_UPDATE = (
    "REMOVE {heads} SET #f = list_append(if_not_exists(#f, :empty), :ids),"
    " #fn = list_append(if_not_exists(#fn, :empty), :refs),"
    " #k = :k, #kn = :n, #v = :v"
)
QUEUE_ELEMENT = "#q[{index}], #qn[{index}]"
# [K1] a take's report: the in-flight list without the completed ids (they join d), or no
# in-flight list when none is left
REPORT_KEPT_SETS = ("#f = :kf", "#fn = :kfn")
REPORT_NONE_KEPT_REMOVES = ("#f", "#fn")
TAKE_CONDITION = f"{LIVE_OWNER} AND #t = :tok AND #q[0] = :head"

# [G6] + [N1] a signal owner (heading its in-flight list) with nothing queued: all in flight and
# the owner remembered as completed (:mark ends the batch), the key freed and out of the index
RELEASE_IDLE_UPDATE = (
    "SET #p = :me, #pt = #t, #v = :v, #ttl = :ttl,"
    " #d = list_append(list_append(if_not_exists(#d, :empty), #f), :mark)"
    " REMOVE #o, #c, #w, #k, #kn, #f, #fn, #q, #qn, #gp, #gx, #a"
)
# Only the owner alone in flight: its batch is then the owner's id, last as the model's
# remember_done leaves it. An owner that took signals completes from the snapshot instead
# (complete(), owner last), so a batch over DONE_LIMIT forgets the same ids as every backend.
_ALONE = "size(#f) = :one"
RELEASE_IDLE_CONDITION = f"{LIVE_OWNER} AND #f[0] = :me AND {_ALONE} AND {QUEUE_EMPTY}"
RELEASE_IDLE_GRANT_CONDITION = (
    f"{LIVE_OWNER} AND #t = :grant AND #f[0] = :me AND {_ALONE} AND {QUEUE_EMPTY}"
)

# [G2] ``d`` rewritten as what it remembers after a blind append, only if it is still as that
# append left it (its length, and its last element, a unique marker, where it was)
PRUNE_UPDATE = "SET #d = :done"
PRUNE_CONDITION = "size(#d) = :n AND #d[{last}] = :m"

# [G6] the completion, then [L4] / [T1] / [N1] [N2] [N3]: SET {sets} REMOVE {removes}, from the
# clauses below; pinned to the snapshot of the live grant (appends allowed, except where a
# release would drop them: COMPLETE_RELEASE_CONDITION)
COMPLETE_UPDATE = "SET {sets} REMOVE {removes}"
COMPLETE_CONDITION = f"{LIVE_OWNER} AND #t = :tok AND " + "{version}"
COMPLETE_RELEASE_CONDITION = COMPLETE_CONDITION + " AND {queue}"
COMPLETE_SETS = ("#p = :me", "#pt = :tok", "#v = :v")
COMPLETE_REMOVES = ("#k", "#kn", "#w")
# [G2] the batch of completed ids (or the failed owner's nested entry), ended by its marker
REMEMBER_DONE = "#d = list_append(if_not_exists(#d, :empty), :done)"
# [G2] ... or, once enough of it is forgotten, d rewritten whole as what it remembers
REWRITE_DONE = "#d = :done"
# [G6] dead letters listed; the key is in the dead_letters index until [V1] moves the last
DEAD_LETTER_SETS = (
    "#x = list_append(if_not_exists(#x, :empty), :xid)",
    "#xn = list_append(if_not_exists(#xn, :empty), :xref)",
    "#gd = :dshard",
)
# [G6] dead-lettered under on_poison="halt"
HALT_SET = "#h = :true"
# [G5] [G6] [V1] (id, ref) pairs at the head of the queue; appends stay behind them
QUEUE_AT_HEAD = (
    "#q = list_append(:rq, if_not_exists(#q, :empty))",
    "#qn = list_append(:rqn, if_not_exists(#qn, :empty))",
)
# [L4] then [G7]: free, the queue stays for the sweeper
THEN_FREE_SETS = ("#gx = :zero", "#ttl = :ttl")
THEN_FREE_REMOVES = ("#o", "#c", "#f", "#fn")
# [T1] then [G3] the grant to :to, prev = :me
THEN_TO_SETS = ("#o = :to", "#e = :exp", "#t = :new", "#c = :true", "#ttl = :ttl")
THEN_TO_REMOVES = ("#f", "#fn")
# [N1] halted: released with the queue kept; out of the orphan index until [V1]
THEN_HALTED_SETS = ("#ttl = :ttl",)
THEN_HALTED_REMOVES = ("#o", "#c", "#f", "#fn", "#gp", "#gx")
# [N1] nothing with a payload queued: released, out of the orphan index
THEN_RELEASED_SETS = ("#ttl = :ttl",)
THEN_RELEASED_REMOVES = ("#o", "#c", "#f", "#fn", "#q", "#qn", "#gp", "#gx")
# [N2] [N3] too many gone entries (payloads past their TTL) ahead of the head for one
# expression: the first batch of them leaves first (QUEUE_ELEMENT), with their attempt counts
GONE_AHEAD_SETS = ("#v = :v",)
# [N2] [N3] the head owns the key, claimed or not ([G3] nonce None, prev = :me); queued entries
# it passed are removed by index (QUEUE_ELEMENT)
THEN_NEXT_SETS = (
    "#o = :next",
    "#e = :exp",
    "#t = :new",
    "#c = :claimed",
    "#f = :f",
    "#fn = :fn",
    "#gp = :shard",
    "#gx = :exp",
    "#ttl = :ttl",
)
ATTEMPTS_SET = "#a = :a"
ATTEMPTS = "#a"

# [G6] a dead letter's error, attempts and time, on its payload item (if TTL left it)
MARK_DEAD_UPDATE = "SET #de = :err, #da = :att, #df = :at, #ttl = :ttl"
# a stored payload item (a split one's pieces too) kept retention_s longer
PAYLOAD_TTL_UPDATE = "SET #ttl = :ttl"

# -- claims, adoption, redrive ------------------------------------------------------------------

# [D1] [Q6] [C4] [G5] [G4] an orphaned key: the dead owner's work back to the head (the queue
# rewritten whole), the first with a payload owns the key under grant nonce :w; never a halted
# key ([D4] [Q9]: the version pins h too)
ORPHAN_CONDITION = "{version} AND {queue} AND " + TAKEOVER + " AND attribute_not_exists(#h)"
# [C4] the grant of envelope :env (the last token issued, heading in flight) run again
ENVELOPE_CONDITION = ORPHAN_CONDITION + " AND #t = :tok AND #f[0] = :env"
# [N1] [C3] no queued or in-flight signal has a payload left (TTL): dropped
DROP_GONE_UPDATE = "SET #v = :v REMOVE #q, #qn, #f, #fn, #gp, #gx, #a"
_ORPHAN_GRANT = (
    "SET #o = :next, #e = :exp, #t = :new, #c = :claimed, #w = :w, #v = :v,"
    " #f = :f, #fn = :fn, #gp = :shard, #gx = :exp, #ttl = :ttl"
)
# ... with others queued behind the head, and attempts counted
ORPHAN_GRANT_UPDATE = f"{_ORPHAN_GRANT}, #q = :q, #qn = :qn, #a = :a REMOVE #p, #pt, #k, #kn"
# ... with others queued behind the head, no attempts counted
ORPHAN_GRANT_FRESH_UPDATE = f"{_ORPHAN_GRANT}, #q = :q, #qn = :qn REMOVE #p, #pt, #k, #kn, #a"
# ... the head alone, attempts counted
ORPHAN_GRANT_ALONE_UPDATE = f"{_ORPHAN_GRANT}, #a = :a REMOVE #p, #pt, #k, #kn, #q, #qn"
# ... the head alone, no attempts counted
ORPHAN_GRANT_ALONE_FRESH_UPDATE = f"{_ORPHAN_GRANT} REMOVE #p, #pt, #k, #kn, #q, #qn, #a"

# [C1] claimed once, under this call's grant nonce; the deadline refreshed
CLAIM_UPDATE = "SET #c = :true, #e = :exp, #ttl = :ttl, #w = :w, #v = :v"
CLAIM_CONDITION = f"{LIVE_OWNER} AND #t = :tok AND #c = :false"

# [D2] the owner is alive (it renewed since it was indexed): its entry moves to its deadline
REINDEX_UPDATE = "SET #gx = #e"
REINDEX_CONDITION = "attribute_exists(#gp) AND attribute_exists(#o) AND #e >= :cutoff"
# [D4] a halted key leaves the orphan index (index moves keep the version)
UNINDEX_UPDATE = "REMOVE #gp, #gx"
UNINDEX_CONDITION = "attribute_exists(#h) AND attribute_exists(#gp)"

# [D1] index candidates: keys in one orphans shard whose indexed deadline passed
ORPHAN_KEYS = "#gp = :g AND #gx < :cutoff"
# keys in one dead_letters shard
DEAD_LETTER_KEYS = "#gd = :g"

# [V1] dead letters back at the head of the queue, in the order they died; no longer halted,
# in the orphan index; the call remembered (rv, rn, ra: its nonce, how many it moved, when) for
# [V3], its resend; pinned to the snapshot ({version}) ...
_REDRIVE = (
    f"SET {QUEUE_AT_HEAD[0]}, {QUEUE_AT_HEAD[1]}, #v = :v, #gp = :shard, #gx = :gx, #ttl = :ttl,"
    " #rv = :rv, #rn = :rn, #ra = :now"
)
# ... others stay dead letters
REDRIVE_UPDATE = f"{_REDRIVE}, #x = :x, #xn = :xn REMOVE #h"
# ... the last ones moved: out of the dead_letters index
REDRIVE_ALL_UPDATE = f"{_REDRIVE} REMOVE #h, #x, #xn, #gd"
