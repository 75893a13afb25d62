"""The explorer's world and its identity: one state of the search (the model's key records, the
actors talking to them, the history the invariants need) and the canonical key under which
equivalent states are explored once, with the bookkeeping every layer of the explorer shares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from leaseguard.signals import Signal, encode_signal
from leaseguard.types import KeyState, LeaseResult

from .bounds import Bounds
from .guarded import TICK_MS, ActorSpec, Advance, Input
from .model import ProtocolModel
from .state import Full, KeyRecord, Lost


class Call(NamedTuple):
    """A call the model has applied, its reply on the wire to the caller."""

    op: str
    args: tuple[Any, ...]
    nonce: str
    sent_at: int
    first: Any  # the reply of the first application
    reply: Any  # the reply the caller will see
    resent: bool
    apply: Any = None  # the step, (record, now, nonce) -> reply: not part of the state
    hashed: tuple[Any, ...] = ()  # op, args, first and reply as dictionary keys (see heard)

    def heard(self) -> Call:
        """This call with :attr:`hashed` filled in (once per reply it will deliver)."""
        parts = (self.op, hashable(self.args), hashable(self.first), hashable(self.reply))
        return self._replace(hashed=(*parts, self.resent))


class Actor(NamedTuple):
    """An invocation, a receiver of an envelope, or the sweeper: the guard's own flow (or the
    sweeper's) on the inputs it was given so far (:mod:`leaseguard.protocol.guarded`)."""

    aid: str
    spec: ActorSpec
    serial: int  # unique per spawn, for its calls' nonces (not part of the state)
    script: tuple[Input, ...] = ()
    call: Call | None = None  # applied, its reply not delivered yet
    trail: tuple[Any, ...] = ()  # the script, hashable (not part of the state)
    adv: Advance | None = None  # where the script leads (not part of the state)

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def event(self) -> str | None:
        return self.spec.event


class Book(NamedTuple):
    """History the invariants need (part of the state: two states with different pasts can
    differ in what is allowed next)."""

    arrived: int
    faults: int
    runs: tuple[int, ...]
    excuses: tuple[int, ...]
    oks: tuple[bool, ...]
    started: tuple[bool, ...]
    enqueued: tuple[str, ...]  # forwarded events in the order they were queued
    expiries: int  # leases that ran out so far
    retries: tuple[int, ...]  # platform retries used per event
    gave_up: tuple[bool, ...]  # the platform saw the event fail and stopped retrying
    pending: tuple[tuple[str, ...], ...]  # platform deliveries due: ('e', id) | ('env', ...)
    redrives: int = 0
    evicted: tuple[str, ...] = ()  # ids the done memory forgot at its bound (oldest first)
    resends: tuple[
        tuple[str, str, int], ...
    ] = ()  # redrives whose reply was lost: key, nonce, moved
    # per event since its last redrive, for (l): runs the backend may count as started (a
    # claimed grant, a batch item's run, a take that reached its handler or died with the
    # taker), and attempts it was charged
    starts: tuple[int, ...] = ()
    charges: tuple[int, ...] = ()
    # moved in flight by a take whose reply has not reached its taker (on the wire, given up,
    # or the taker died): a lease running out over them charges a run that may have started
    ambiguous: tuple[str, ...] = ()
    # ids whose success a later step of their runner reported (a take's completed=, a
    # hand-off): they never run again (d)
    reported: tuple[str, ...] = ()
    # per event, for (o): the earliest time its next run may start, after a failed run sent it
    # back to the queue under a retry delay (0: no wait)
    waits: tuple[int, ...] = ()


@dataclass
class World:
    now: int
    recs: list[KeyRecord]
    actors: tuple[Actor, ...]
    book: Book
    violation: str | None = None
    # per key, the last write a failover may lose (failover.LastWrite), when the bound has
    # failovers
    undo: tuple[Any, ...] = ()

    def key(
        self, ttl: int, keys: list[str], until: Callable[[Actor, int], int | None]
    ) -> tuple[Any, ...]:
        """The state as far as the future can tell. Times are relative to now (time matters
        only through deadlines), tokens relative to each key's last token (only their order
        matters), a nonce only as *which pending call* it belongs to (a fresh call never
        matches an old one), and run counts as the slack left before (d) fires."""
        now = self.now
        base = {k: r.token for k, r in zip(keys, self.recs, strict=True)}
        live = {a.call.nonce: n for n, a in enumerate(self.actors) if a.call is not None}
        recs = tuple(_canon_record(r.freeze(now), live, r.token) for r in self.recs)
        actors = tuple(_canon_actor(a, now, ttl, base[a.key], until(a, now)) for a in self.actors)
        b = self.book
        slack = tuple(min(1 + e - r, 3) for e, r in zip(b.excuses, b.runs, strict=True))
        pending = tuple(
            item if item[0] == "e" else (*item[:3], int(item[3]) - base[item[1]])
            for item in b.pending
        )
        book = (
            b.arrived,
            b.faults,
            slack,
            b.oks,
            b.started,
            b.enqueued,
            b.expiries,
            b.redrives,
            b.evicted,
            b.resends,
            b.starts,
            b.charges,
            b.ambiguous,
            b.reported,
            tuple(max(0, t - now) for t in b.waits),
        )
        undo = tuple(
            None
            if last is None
            else (
                _canon_record(last.before.freeze(now), live, r.token),
                next((n for n, a in enumerate(self.actors) if a.aid == last.aid), -1),
                last.acknowledged,
            )
            for last, r in zip(self.undo, self.recs, strict=False)
        )
        return (recs, actors, book, b.retries, b.gave_up, pending, undo)

    def copy(self) -> World:
        recs = [r.clone() for r in self.recs]
        return World(self.now, recs, self.actors, self.book, undo=self.undo)


def _rel(value: Any, base: int) -> Any:
    """Replies and arguments with tokens relative to ``base``."""
    if isinstance(value, LeaseResult):
        adopted = value.adopted and _rel(value.adopted, base)
        token = None if value.token is None else value.token - base
        return ("R", value.acquired, value.owner, token, value.position, adopted)
    if isinstance(value, Signal):
        return ("S", value.id, None if value.token is None else value.token - base, value.attempts)
    if isinstance(value, list):
        return ("L", *(_rel(v, base) for v in value))
    if isinstance(value, (Lost, Full)):
        return value
    if isinstance(value, KeyState):
        # inspect_key's reply: the guard reads only which ids are dead letters (see
        # FailureReporter.reported_dead), so states that differ in the rest are one
        return ("K", tuple(letter.id for letter in value.dead_letters))
    if isinstance(value, tuple):
        return tuple(_rel(v, base) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value - base
    return value


def _canon_record(image: tuple[Any, ...], live: dict[str, int], base: int) -> tuple[Any, ...]:
    owner, _token, expires, claimed, grant, prev, prev_token, take, count, *rest = image
    done = tuple((sid, t - base, ok, n) for sid, t, ok, n in rest[-1])
    return (
        owner,
        expires,
        claimed,
        live.get(grant, -1) if grant is not None else None,
        prev,
        None if prev_token is None else prev_token - base,
        live.get(take, -1) if take is not None else None,
        count,
        *rest[:-1],
        done,
    )


def _canon_actor(a: Actor, now: int, ttl: int, base: int, until: int | None) -> tuple[Any, ...]:
    """An actor as far as its future can tell: what it was given (its script) without when,
    plus the times the flow still reads. The flow reads its clock only to start a lease's
    clock (the grant or renewal request's send time, kept in the pending call), to ask whether
    its lease ran out (``until``: the current grant's validity relative to now, or -1 once
    lost) and for durations that only reach logs and metrics, or the handoff policy, which
    the explorer's deadlines (none, or already past) decide alone. Tokens are relative to the
    key's."""
    spec, call = a.spec, a.call
    canon_call: tuple[Any, ...] | None = None
    if call is not None:
        sent = max(call.sent_at - now, -ttl - 1) if call.op in _LEASE_CLOCK_OPS else 0
        canon_call = (_canon_call(call.hashed, base), sent)
    script = _canon_script(a.trail, base)
    token = None if spec.token is None else spec.token - base
    return (a.aid, spec.kind, spec.owner, token, script, until, canon_call)


@functools.lru_cache(maxsize=1 << 16)
def _canon_script(trail: tuple[Any, ...], base: int) -> tuple[Any, ...]:
    """A script without its times, tokens relative to ``base`` (``trail``: the script's
    hashable form, tokens absolute)."""
    return tuple(
        (kind, value if kind == "time_left" else _rel_hashed(value, base))
        for kind, _now, value in trail
    )


@functools.lru_cache(maxsize=1 << 16)
def _canon_call(hashed: tuple[Any, ...], base: int) -> tuple[Any, ...]:
    return _rel_hashed(hashed, base)  # type: ignore[no-any-return]


def _rel_hashed(value: Any, base: int) -> Any:
    """:func:`_rel` of a value already in :func:`hashable` form (tokens absolute)."""
    if isinstance(value, tuple):
        if value and value[0] == "R":
            _, acquired, owner, token, position, adopted = value
            token = None if token is None else token - base
            return ("R", acquired, owner, token, position, adopted and _rel_hashed(adopted, base))
        if value and value[0] == "S":
            return ("S", value[1], None if value[2] is None else value[2] - base, value[3])
        if isinstance(value, (Lost, Full)):
            return value
        return tuple(_rel_hashed(v, base) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value - base
    return value


# The calls whose send time starts a lease's clock in the guard (its LeaseHandle's validity).
_LEASE_CLOCK_OPS = frozenset(
    ("acquire_or_enqueue", "claim_signal", "renew_lease", "transfer_to_next", "enqueue")
)


def hashable(value: Any) -> Any:
    """A script value as a dictionary key (a signal's payload is a dict)."""
    return _rel(value, 0)


def event_index(sid: str) -> int:
    """``e3`` -> 2: an event's slot in the book's per-event tuples."""
    return int(sid[1:]) - 1


def show(reply: Any) -> str:
    """A reply as a trace line shows it."""
    if isinstance(reply, LeaseResult):
        if reply.acquired:
            adopted = f", runs {reply.adopted.id} first" if reply.adopted else ""
            return f"acquired {reply.owner}@{reply.token}{adopted}"
        if reply.position is None:
            return f"duplicate (holder {reply.owner})"
        return f"queued at {reply.position} behind {reply.owner}"
    if isinstance(reply, Signal):
        return f"signal {reply.id}@{reply.token}"
    if isinstance(reply, Lost):  # before tuple: a NamedTuple is one
        return f"lost (holder {reply.holder})"
    if isinstance(reply, Full):
        return f"queue full at {reply.depth} (holder {reply.holder})"
    if isinstance(reply, KeyState):
        return f"dead letters {[letter.id for letter in reply.dead_letters]}"
    if isinstance(reply, tuple):
        return "[" + ", ".join(s.id for s in reply) + "]"
    return repr(reply)


class ExplorerBase:
    """The explorer's fixed setting (bounds, model, client rules, the events and keys) and the
    bookkeeping on a world that the invariants, the client and the search all do."""

    def __init__(
        self,
        bounds: Bounds | None = None,
        model: ProtocolModel | None = None,
    ) -> None:
        bounds = bounds or Bounds()
        self.b = bounds
        self.ttl_ms = bounds.ttl * TICK_MS
        self.model = model or ProtocolModel(token_floor=lambda now: 0)
        if bounds.done_limit is not None:
            self.model.done_limit = bounds.done_limit
        if bounds.dead_limit is not None:
            self.model.dead_limit = bounds.dead_limit
        self.events = [f"e{i + 1}" for i in range(bounds.events)]
        self.keys = [f"k{i + 1}" for i in range(bounds.keys)]
        self.records = {s: encode_signal(Signal(s, s, 0)) for s in self.events}

    # -- the world --------------------------------------------------------------------------

    def initial(self) -> World:
        n = self.b.events
        book = Book(
            arrived=0,
            faults=0,
            runs=(0,) * n,
            excuses=(0,) * n,
            oks=(False,) * n,
            started=(False,) * n,
            enqueued=(),
            expiries=0,
            retries=(0,) * n,
            gave_up=(False,) * n,
            pending=(),
            starts=(0,) * n,
            charges=(0,) * n,
            waits=(0,) * n,
        )
        undo = (None,) * len(self.keys) if self.b.failovers else ()
        return World(0, [KeyRecord() for _ in self.keys], (), book, undo=undo)

    def key_of(self, sid: str) -> str:
        return self.keys[event_index(sid) % len(self.keys)]

    def rec(self, w: World, key: str) -> KeyRecord:
        return w.recs[self.keys.index(key)]

    # -- bookkeeping ----------------------------------------------------------------------------

    @staticmethod
    def bump(values: tuple[int, ...], sids: Iterator[str] | tuple[str, ...]) -> tuple[int, ...]:
        out = list(values)
        for sid in sids:
            if sid:
                out[event_index(sid)] += 1
        return tuple(out)

    @staticmethod
    def handled(book: Book, sids: tuple[str | None, ...]) -> Book:
        oks = list(book.oks)
        for sid in sids:
            if sid is not None:
                oks[event_index(sid)] = True
        return book._replace(oks=tuple(oks))

    def excuse(self, w: World, sids: tuple[str, ...]) -> None:
        w.book = w.book._replace(excuses=self.bump(w.book.excuses, sids))

    def deliver_later(self, w: World, item: tuple[str, ...]) -> None:
        w.book = w.book._replace(pending=(*w.book.pending, item))

    def platform_retry(self, w: World, sid: str) -> None:
        """The platform saw ``sid``'s invocation fail: it retries, or gives up visibly."""
        i = event_index(sid)
        if w.book.retries[i] < self.b.platform_retries:
            self.deliver_later(w, ("e", sid))
        else:
            gave_up = list(w.book.gave_up)
            gave_up[i] = True
            w.book = w.book._replace(gave_up=tuple(gave_up))

    def replace_actor(self, w: World, n: int, a: Actor | None) -> None:
        if a is None:
            w.actors = w.actors[:n] + w.actors[n + 1 :]
        else:
            w.actors = (*w.actors[:n], a, *w.actors[n + 1 :])

    def fault(self, w: World) -> None:
        w.book = w.book._replace(faults=w.book.faults + 1)
