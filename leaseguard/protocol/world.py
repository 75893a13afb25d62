"""The explorer's world and its identity: one state of the search (the model's key records, the
actors talking to them, the history the invariants need) and the canonical key under which
equivalent states are explored once, with the bookkeeping every layer of the explorer shares.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from leaseguard.signals import Signal, encode_signal
from leaseguard.types import LeaseResult

from .bounds import Bounds, ClientRules
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


class Actor(NamedTuple):
    """An invocation, a receiver of an envelope, or the sweeper, and where it is in its flow."""

    aid: str
    kind: str  # inv | recv | sweep
    key: str
    event: str | None  # an invocation's own event
    phase: str  # start | acq | run | next | claim | adopt
    call: Call | None
    sid: str | None = None  # the signal being run
    token: int | None = None
    valid_until: int = 0
    lost: bool = False
    taken: tuple[str, ...] = ()
    takes: int = 0
    renews: int = 0
    error: bool = False
    own_error: bool = False  # the invocation's own event failed: the platform retries it
    seq: int = 0
    spent: bool = False  # granted with attempts >= max_attempts: dead-lettered unrun


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


@dataclass
class World:
    now: int
    recs: list[KeyRecord]
    actors: tuple[Actor, ...]
    book: Book
    violation: str | None = None

    def key(self, ttl: int, keys: list[str]) -> tuple[Any, ...]:
        """The state as far as the future can tell. Times are relative to now (time matters
        only through deadlines), tokens relative to each key's last token (only their order
        matters), a nonce only as *which pending call* it belongs to (a fresh call never
        matches an old one), and run counts as the slack left before (d) fires."""
        now = self.now
        base = {k: r.token for k, r in zip(keys, self.recs, strict=True)}
        live = {a.call.nonce: n for n, a in enumerate(self.actors) if a.call is not None}
        recs = tuple(_canon_record(r.freeze(now), live, r.token) for r in self.recs)
        actors = tuple(_canon_actor(a, now, ttl, base[a.key]) for a in self.actors)
        b = self.book
        slack = tuple(min(1 + e - r, 3) for e, r in zip(b.excuses, b.runs, strict=True))
        pending = tuple(
            item if item[0] == "e" else (*item[:3], int(item[3]) - base[item[1]])
            for item in b.pending
        )
        book = (b.arrived, b.faults, slack, b.oks, b.started, b.enqueued, b.expiries, b.redrives)
        return (recs, actors, book, b.retries, b.gave_up, pending)

    def copy(self) -> World:
        return World(self.now, [r.clone() for r in self.recs], self.actors, self.book)


def _rel(value: Any, base: int) -> Any:
    """Replies and arguments with tokens relative to ``base``."""
    if isinstance(value, LeaseResult):
        adopted = value.adopted and _rel(value.adopted, base)
        token = None if value.token is None else value.token - base
        return ("R", value.acquired, value.owner, token, value.position, adopted)
    if isinstance(value, Signal):
        return ("S", value.id, None if value.token is None else value.token - base, value.attempts)
    if isinstance(value, (Lost, Full)):
        return value
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


@functools.lru_cache(maxsize=1 << 18)
def _canon_actor(a: Actor, now: int, ttl: int, base: int) -> tuple[Any, ...]:
    call = a.call
    canon_call = call and (
        call.op,
        _rel(call.args, base),
        _sent_at(call, now, ttl),
        _rel(call.first, base),
        _rel(call.reply, base),
        call.resent,
    )
    return (
        a.aid,
        a.phase,
        canon_call,
        a.sid,
        None if a.token is None else a.token - base,
        max(a.valid_until - now, 0),
        a.lost,
        a.taken,
        a.takes,
        a.renews,
        a.error,
        a.own_error,
        a.spent,
    )


def _sent_at(call: Call, now: int, ttl: int) -> int:
    """When a call was sent matters only to calls whose reply starts a lease clock."""
    if call.op in ("acquire", "renew", "claim", "enqueue") or (call.op == "next" and call.args[2]):
        return max(call.sent_at - now, -ttl)
    return 0


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
        rules: ClientRules | None = None,
    ) -> None:
        bounds = bounds or Bounds()
        self.b = bounds
        self.model = model or ProtocolModel(token_floor=lambda now: 0)
        self.rules = rules or ClientRules()
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
        )
        return World(0, [KeyRecord() for _ in self.keys], (), book)

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
