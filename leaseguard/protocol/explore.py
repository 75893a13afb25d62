"""Exhaustive explicit-state search of the protocol model and the guard's client flow.

``make model-check`` runs ``python -m leaseguard.protocol.explore``. The world is the model's
key records plus every actor that talks to them:

* **invocations**, one per delivery of an event, following the guard's flow
  (``acquire_or_enqueue`` -> run -> ``take_signals``/renew -> ``transfer_to_next`` -> the next
  signal inline, or an envelope to a receiver, or done);
* **receivers** of hand-off envelopes (``claim_signal`` -> run -> ``transfer_to_next`` ...);
* **the sweeper** (``adopt_orphans`` -> envelope);
* **the platform**: retries of failed invocations and envelopes, duplicate deliveries;
* **the environment**: time advancing (leases expire, owners pause), and faults, each counted
  against a budget: a reply lost after the step applied and then resent with the same nonce
  (possibly after other actors' steps), a caller that gives up after the step applied, a crash
  at any point, a handler that raises.

Every call is two transitions, *apply* and *deliver*, so other actors (and time) can move while
a reply is on the wire. Breadth-first search finds the shortest trace to any violation of the
invariants in docs/protocol.md:

(a) no two handler runs of a key both believe they hold the lease, and a run that believes it
    does is the backend's owner with its token; (b) tokens strictly increase per key; (c) in
    every quiescent state, after the sweeper and retries run to a fixpoint, every event was
    handled successfully, dead-lettered, or visibly failed to the platform; (d) an event runs
    more than once only after a crash, a give-up, a handler error or an expired lease; (e)
    forwarded events start in arrival order per key; (f) a run that held its lease is never told
    it lost it; (g) a released key never keeps queued signals (no lost wakeup); (h) a resent
    call that was applied is answered as applied.

Mutants (:mod:`leaseguard.protocol.mutants`) break one rule each; every one must be caught, or
the invariants are vacuous.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from leaseguard.signals import Signal, encode_signal
from leaseguard.types import LeaseResult

from .model import Failure, Full, KeyRecord, Lost, ProtocolModel

LIMIT = 10  # take_signals batch size


@dataclass(frozen=True)
class Bounds:
    events: int = 3
    keys: int = 1
    faults: int = 2
    expiries: int = 1  # leases that may run out (each starts a take-over)
    ttl: int = 2
    platform_retries: int = 1
    takes: int = 1  # take_signals calls per run
    renews: int = 1  # renewals per run
    max_attempts: int = 2
    max_queue: int = 1000  # the forward bound (row Q8)
    halt: bool = False  # failures report on_poison="halt" (rows G6, N1, Q9, D4)
    redrives: int = 0  # operator redrives of a key's dead letters (row V1)


@dataclass(frozen=True)
class ClientRules:
    """How the client (the guard) behaves; mutants change one rule."""

    valid_from_send: bool = True  # a handle's TTL clock starts when the request was sent
    atomic_forward: bool = True  # forward with one acquire_or_enqueue (not read, then enqueue)
    failed_take_fails_run: bool = True  # a run whose take_signals failed ends as failed
    full_fails_visibly: bool = True  # a forward refused by a full queue fails the invocation


class Call(NamedTuple):
    op: str
    args: tuple[Any, ...]
    nonce: str
    sent_at: int
    first: Any  # the reply of the first application
    reply: Any  # the reply the caller will see
    resent: bool


class Actor(NamedTuple):
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


@dataclass
class Result:
    states: int = 0
    transitions: int = 0
    violations: int = 0
    trace: list[str] = field(default_factory=list)
    message: str | None = None
    seconds: float = 0.0


def _idx(sid: str) -> int:
    return int(sid[1:]) - 1


class Explorer:
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
        return self.keys[_idx(sid) % len(self.keys)]

    def rec(self, w: World, key: str) -> KeyRecord:
        return w.recs[self.keys.index(key)]

    # -- bookkeeping ----------------------------------------------------------------------------

    @staticmethod
    def bump(values: tuple[int, ...], sids: Iterator[str] | tuple[str, ...]) -> tuple[int, ...]:
        out = list(values)
        for sid in sids:
            if sid:
                out[_idx(sid)] += 1
        return tuple(out)

    @staticmethod
    def handled(book: Book, sids: tuple[str | None, ...]) -> Book:
        oks = list(book.oks)
        for sid in sids:
            if sid is not None:
                oks[_idx(sid)] = True
        return book._replace(oks=tuple(oks))

    def excuse(self, w: World, sids: tuple[str, ...]) -> None:
        w.book = w.book._replace(excuses=self.bump(w.book.excuses, sids))

    def start(self, w: World, key: str, sid: str) -> None:
        """A handler run begins on ``sid``: (d) and (e) are checked here."""
        book = w.book
        i = _idx(sid)
        runs = self.bump(book.runs, (sid,))
        if runs[i] > 1 + book.excuses[i] and w.violation is None:
            w.violation = f"(d) {sid} runs a second time with no crash, give-up, error or expiry"
        if sid in book.enqueued and not book.started[i]:
            for earlier in book.enqueued[: book.enqueued.index(sid)]:
                if (
                    self.key_of(earlier) == key
                    and not book.started[_idx(earlier)]
                    and w.violation is None
                ):
                    w.violation = f"(e) {sid} starts before {earlier}, queued earlier on {key}"
        if self.b.halt and sid in book.enqueued and w.violation is None:
            for dead in self.rec(w, key).dead:
                if dead.id in book.enqueued and (
                    book.enqueued.index(dead.id) < book.enqueued.index(sid)
                ):
                    w.violation = (
                        f"(i) {sid} starts while {dead.id}, queued before it, is dead-lettered "
                        "on a halted key"
                    )
        started = list(book.started)
        started[i] = True
        w.book = book._replace(runs=runs, started=tuple(started))

    def deliver_later(self, w: World, item: tuple[str, ...]) -> None:
        w.book = w.book._replace(pending=(*w.book.pending, item))

    def platform_retry(self, w: World, sid: str) -> None:
        """The platform saw ``sid``'s invocation fail: it retries, or gives up visibly."""
        i = _idx(sid)
        if w.book.retries[i] < self.b.platform_retries:
            self.deliver_later(w, ("e", sid))
        else:
            gave_up = list(w.book.gave_up)
            gave_up[i] = True
            w.book = w.book._replace(gave_up=tuple(gave_up))

    # -- applying a step to the model ------------------------------------------------------------

    def apply(self, w: World, actor: Actor, op: str, args: tuple[Any, ...], nonce: str) -> Any:
        rec = self.rec(w, actor.key)
        before = set(rec.stored)
        grants = [(r.owner, r.token) for r in w.recs]
        ttl, now, m = self.b.ttl, w.now, self.model
        reply: Any
        if op == "acquire":
            known = args[0] in before
            reply = m.acquire_or_enqueue(
                rec, args[0], self.records[args[0]], ttl, nonce, now, self.b.max_queue
            )
            queued = isinstance(reply, LeaseResult) and reply.position is not None
            if queued and not known and reply.position > self.b.max_queue and not w.violation:
                w.violation = f"(j) {args[0]} was queued at {reply.position}, past max_queue"
        elif op == "peek":
            reply = m.get_owner(rec, now)
        elif op == "enqueue":  # only the read-then-enqueue mutant's client sends this
            reply = m.enqueue_raw(rec, args[0], self.records[args[0]])  # type: ignore[attr-defined]
        elif op == "take":
            taken = m.take(rec, args[0], LIMIT, args[1], nonce, now)
            reply = taken if isinstance(taken, Lost) else tuple(taken)
        elif op == "renew":
            reply = m.renew(rec, args[0], ttl, args[1], now)
        elif op == "next":
            owner, token, claim, failure = args
            reply = m.transfer_to_next(rec, owner, ttl, claim, token, now, failure)
        elif op == "claim":
            reply = m.claim(rec, args[0], args[1], ttl, nonce, now)
        elif op == "adopt":
            reply = m.adopt(rec, ttl, False, nonce, now)
        elif op == "redrive":
            reply = m.redrive(rec, None, now)
        else:  # pragma: no cover
            raise AssertionError(op)
        for sid in rec.queue:
            if sid not in before and sid not in w.book.enqueued:
                w.book = w.book._replace(enqueued=(*w.book.enqueued, sid))
        self.check_tokens(w, grants)
        return reply

    def check_tokens(self, w: World, before: list[tuple[str | None, int]]) -> None:
        """(b): every new grant carries a larger token than any before it on that key."""
        for (owner, token), rec in zip(before, w.recs, strict=True):
            granted = rec.owner is not None and (rec.owner, rec.token) != (owner, token)
            if (rec.token < token or (granted and rec.token == token)) and w.violation is None:
                w.violation = f"(b) {rec.owner} was granted token {rec.token} after {token}"

    def send(self, w: World, a: Actor, op: str, args: tuple[Any, ...], phase: str) -> Actor:
        # Unique per call; the state's key never shows it (see World.key).
        nonce = f"{a.aid}.{a.seq}.{w.now}.{self.rec(w, a.key).token}"
        reply = self.apply(w, a, op, args, nonce)
        return a._replace(
            phase=phase, call=Call(op, args, nonce, w.now, reply, reply, False), seq=a.seq + 1
        )

    # -- transitions ----------------------------------------------------------------------------

    def successors(self, w: World) -> Iterator[tuple[str, World]]:
        b, book = self.b, w.book
        faults_left = book.faults < b.faults
        if book.arrived < b.events:
            sid = self.events[book.arrived]
            nw = w.copy()
            nw.book = book._replace(arrived=book.arrived + 1)
            label = self.spawn(nw, Actor(sid, "inv", self.key_of(sid), sid, "start", None))
            yield f"event {sid} arrives: {label}", nw
        for n, item in enumerate(book.pending):
            nw = w.copy()
            nw.book = book._replace(pending=book.pending[:n] + book.pending[n + 1 :])
            if item[0] == "e":
                sid = item[1]
                i = _idx(sid)
                retries = list(nw.book.retries)
                retries[i] += 1
                nw.book = nw.book._replace(retries=tuple(retries))
                actor = Actor(f"{sid}r{retries[i]}", "inv", self.key_of(sid), sid, "start", None)
                yield f"platform redelivers {sid}: {self.spawn(nw, actor)}", nw
            else:
                _, key, owner, token = item
                for copies in (1, 2) if faults_left else (1,):
                    cw = nw.copy()
                    labels = []
                    for _ in range(copies):
                        aid = f"r.{owner}"
                        while any(x.aid == aid for x in cw.actors):
                            aid += "+"
                        receiver = Actor(aid, "recv", key, None, "claim", None, owner, int(token))
                        labels.append(self.spawn(cw, receiver))
                    if copies == 1:
                        yield f"platform delivers an envelope: {labels[0]}", cw
                    else:
                        self.fault(cw)
                        yield f"FAULT platform delivers an envelope twice: {'; '.join(labels)}", cw
        if faults_left:
            for sid in self.events[: book.arrived]:
                nw = w.copy()
                nw.book = book._replace(faults=book.faults + 1)
                actor = Actor(f"{sid}d{book.faults}", "inv", self.key_of(sid), sid, "start", None)
                yield f"FAULT platform delivers {sid} again: {self.spawn(nw, actor)}", nw
        if book.redrives < b.redrives:
            for key in self.keys:
                if self.rec(w, key).dead:
                    nw = w.copy()
                    nw.book = book._replace(redrives=book.redrives + 1)
                    moved = self.model.redrive(self.rec(nw, key), None, nw.now)
                    yield f"operator redrives {key}: {moved} back at the head", nw
        for key in self.keys:
            rec = self.rec(w, key)
            orphaned = (rec.owner is None or rec.expires <= w.now) and rec.has_work
            orphaned = orphaned and not rec.halted
            if orphaned and not any(a.kind == "sweep" and a.key == key for a in w.actors):
                nw = w.copy()
                sweeper = Actor(f"sw.{key}", "sweep", key, None, "adopt", None)
                yield f"sweeper: {self.spawn(nw, sweeper)}", nw
        expiring = [r for r in w.recs if r.owner is not None and r.expires <= w.now + 1]
        if not expiring or book.expiries < b.expiries:
            nw = w.copy()
            nw.now += 1
            if expiring:
                nw.book = nw.book._replace(expiries=book.expiries + 1)
            for rec in nw.recs:
                if rec.owner is not None and rec.expires <= nw.now:
                    self.excuse(nw, tuple(rec.in_flight))
                self.model.observe(rec, nw.now)
            yield f"time {nw.now}" + (" (a lease runs out)" if expiring else ""), nw
        for n, a in enumerate(w.actors):
            yield from self.actor_steps(w, n, a, faults_left)

    def spawn(self, w: World, a: Actor) -> str:
        """A new actor's first step is its first call (nothing before it is observable)."""
        w.actors = (*w.actors, a)
        n = len(w.actors) - 1
        if a.phase == "claim":
            self.replace_actor(w, n, self.send(w, a, "claim", (a.sid, a.token), "claim"))
            return f"{a.aid} claim_signal({a.sid}@{a.token})"
        if a.phase == "adopt":
            self.replace_actor(w, n, self.send(w, a, "adopt", (), "adopt"))
            return f"{a.aid} adopt_orphans({a.key})"
        if self.rules.atomic_forward:
            self.replace_actor(w, n, self.send(w, a, "acquire", (a.event,), "acq"))
            return f"{a.aid} acquire_or_enqueue({a.event})"
        self.replace_actor(w, n, self.send(w, a, "peek", (), "acq"))
        return f"{a.aid} get_lease_owner"

    def replace_actor(self, w: World, n: int, a: Actor | None) -> None:
        if a is None:
            w.actors = w.actors[:n] + w.actors[n + 1 :]
        else:
            w.actors = (*w.actors[:n], a, *w.actors[n + 1 :])

    def fault(self, w: World) -> None:
        w.book = w.book._replace(faults=w.book.faults + 1)

    def actor_steps(
        self, w: World, n: int, a: Actor, faults_left: bool
    ) -> Iterator[tuple[str, World]]:
        if faults_left:
            nw = w.copy()
            self.fault(nw)
            self.crash(nw, a)
            self.replace_actor(nw, n, None)
            yield f"FAULT {a.aid} crashes ({a.phase})", nw
        if a.call is not None:
            yield from self.reply_steps(w, n, a, faults_left)
        elif a.phase == "run":
            yield from self.run_steps(w, n, a, faults_left)

    def run_steps(
        self, w: World, n: int, a: Actor, faults_left: bool
    ) -> Iterator[tuple[str, World]]:
        name = a.aid
        # A run whose take_signals failed may hold signals it never saw: it ends as failed
        # (the guard treats it so), which retries them instead of completing them.
        forced = (a.error and self.rules.failed_take_fails_run) or a.spent
        outcomes = (True,) if forced else (False, True) if faults_left else (False,)
        for error in outcomes:
            nw = w.copy()
            done = a._replace(phase="next")
            if error and not forced:
                self.fault(nw)
                self.excuse(nw, (a.sid or "", *a.taken))
                own = a.kind == "inv" and a.sid == a.event
                done = done._replace(error=True, own_error=a.own_error or own)
                how = f"FAULT {name} handler raises on {a.sid}"
            elif a.spent:
                how = f"{name} dead-letters {a.sid} unrun (its earlier runs never finished)"
            elif error:
                how = f"{name} run ends failed (its take_signals failed)"
            else:
                nw.book = self.handled(nw.book, (a.sid, *a.taken))
                how = f"{name} handler finishes {a.sid} (+{len(a.taken)} taken)"
            if done.lost or nw.now >= done.valid_until:
                self.finish(nw, n, done)
                yield f"{how}; its lease is lost: no hand-off", nw
                continue
            failure = None
            if error:
                failure = Failure(
                    "handler failed", a.sid != a.event, self.b.max_attempts, self.b.halt
                )
            rec = self.rec(nw, a.key)
            # Inline or by envelope only differ when there is someone to hand to.
            hands_off = bool(rec.queue) or (error and len(rec.in_flight) > (a.sid == a.event))
            for claim in (True, False) if hands_off else (True,):
                cw = nw.copy()
                args = (a.sid, a.token, claim, failure)
                self.replace_actor(cw, n, self.send(cw, done, "next", args, "next"))
                way = "inline" if claim else "by envelope"
                yield f"{how}; transfer_to_next({a.sid}@{a.token}, {way})", cw
        if a.spent:
            return  # not run: nothing to take or renew
        rec = self.rec(w, a.key)
        if a.takes < self.b.takes and not a.lost and rec.queue:
            nw = w.copy()
            na = self.send(nw, a._replace(takes=a.takes + 1), "take", (a.sid, a.token), "run")
            self.replace_actor(nw, n, na)
            yield f"{name} take_signals", nw
        # A renewal in the same tick as the grant or the last renewal changes nothing.
        if a.renews < self.b.renews and not a.lost and a.valid_until < w.now + self.b.ttl:
            nw = w.copy()
            na = self.send(nw, a._replace(renews=a.renews + 1), "renew", (a.sid, a.token), "run")
            self.replace_actor(nw, n, na)
            yield f"{name} renew_lease", nw

    def reply_steps(
        self, w: World, n: int, a: Actor, faults_left: bool
    ) -> Iterator[tuple[str, World]]:
        call = a.call
        assert call is not None
        nw = w.copy()
        self.deliver(nw, n, a._replace(call=None), call, call.reply)
        yield f"{a.aid} gets the reply of {call.op}: {_show(call.reply)}", nw
        if not faults_left or call.op in ("peek", "enqueue"):
            return
        if not call.resent:
            nw = w.copy()
            self.fault(nw)
            reply = self.apply(nw, a, call.op, call.args, call.nonce)
            self.check_resend(nw, a, call, reply)
            self.replace_actor(nw, n, a._replace(call=call._replace(reply=reply, resent=True)))
            yield f"FAULT {a.aid}'s reply of {call.op} is lost; resent: {_show(reply)}", nw
        nw = w.copy()
        self.fault(nw)
        self.give_up(nw, n, a._replace(call=None), call)
        yield f"FAULT {a.aid} gives up on {call.op} (it was applied)", nw

    # -- what each reply does to the caller --------------------------------------------------

    def deliver(self, w: World, n: int, a: Actor, call: Call, reply: Any) -> None:
        op = call.op
        if op == "peek":  # the mutant client: read, then enqueue or acquire
            nxt = "enqueue" if reply is not None else "acquire"
            self.replace_actor(w, n, self.send(w, a, nxt, (a.event,), "acq"))
        elif op in ("acquire", "enqueue"):
            if isinstance(reply, Full) and self.rules.full_fails_visibly and a.event:
                self.platform_retry(w, a.event)  # 429 / a batch item failure / a raise
                self.replace_actor(w, n, None)
                return
            if not isinstance(reply, LeaseResult) or not reply.acquired:
                self.replace_actor(w, n, None)  # forwarded or duplicate: 202, done
                return
            signal = reply.adopted
            sid = signal.id if signal is not None else a.event
            token = signal.token if signal is not None else reply.token
            attempts = signal.attempts if signal is not None else 0
            self.begin(w, n, a, sid, token, call.sent_at, attempts)
        elif op == "take":
            if isinstance(reply, Lost):
                self.replace_actor(w, n, a._replace(lost=True))
                return
            for s in reply:
                self.start(w, a.key, s.id)
            self.replace_actor(w, n, a._replace(taken=(*a.taken, *(s.id for s in reply))))
        elif op == "renew":
            if reply:
                until = self.valid_until(w, call.sent_at)
                self.replace_actor(w, n, a._replace(valid_until=max(a.valid_until, until)))
            else:
                self.replace_actor(w, n, a._replace(lost=True))
        elif op == "next":
            if isinstance(reply, Lost):
                if call.sent_at < a.valid_until and not a.lost and w.violation is None:
                    w.violation = (
                        f"(f) {a.aid} held its lease on {a.sid} but transfer_to_next said lost"
                    )
                self.finish(w, n, a)
            elif reply is None:
                self.finish(w, n, a)
            elif call.args[2]:  # inline: the next signal runs in this invocation
                self.begin(w, n, a, reply.id, reply.token, call.sent_at, reply.attempts)
            else:
                self.deliver_later(w, ("env", a.key, reply.id, str(reply.token)))
                self.finish(w, n, a)
        elif op == "claim":
            if reply is None:
                self.replace_actor(w, n, None)
            else:
                self.begin(w, n, a, reply.id, reply.token, call.sent_at, reply.attempts)
        elif op == "adopt":
            if reply is not None:
                self.deliver_later(w, ("env", a.key, reply.id, str(reply.token)))
            self.replace_actor(w, n, None)

    def begin(
        self,
        w: World,
        n: int,
        a: Actor,
        sid: str | None,
        token: int | None,
        sent_at: int,
        attempts: int = 0,
    ) -> None:
        assert sid is not None
        until = self.valid_until(w, sent_at)
        # The guard dead-letters, unrun, a signal whose earlier runs all died (G5 counted them);
        # the invocation's own event is the platform's to retry.
        spent = attempts >= self.b.max_attempts and not (a.kind == "inv" and sid == a.event)
        if not spent:
            self.start(w, a.key, sid)
        na = a._replace(
            spent=spent,
            phase="run",
            sid=sid,
            token=token,
            valid_until=until,
            lost=False,
            taken=(),
            takes=0,
            renews=0,
            error=False,
        )
        self.replace_actor(w, n, na)

    def valid_until(self, w: World, sent_at: int) -> int:
        """Until when a handle believes in a lease granted or renewed by a call sent at
        ``sent_at`` (the guard's LeaseHandle: counted from the send, never the reply)."""
        return (sent_at if self.rules.valid_from_send else w.now) + self.b.ttl

    def finish(self, w: World, n: int, a: Actor) -> None:
        if a.kind == "inv" and a.own_error and a.event is not None:
            self.platform_retry(w, a.event)  # the invocation re-raises its own event's error
        self.replace_actor(w, n, None)

    def give_up(self, w: World, n: int, a: Actor, call: Call) -> None:
        """The caller saw an error although the step applied."""
        op = call.op
        if op == "acquire":
            assert a.event is not None
            self.excuse(w, (a.event,))
            self.platform_retry(w, a.event)
            self.replace_actor(w, n, None)
        elif op == "take":  # the handler gets the exception; the run ends failed
            self.excuse(w, (a.sid or "", *a.taken))
            own = a.own_error or (a.kind == "inv" and a.sid == a.event)
            self.replace_actor(w, n, a._replace(error=True, own_error=own))
        elif op == "renew":
            self.replace_actor(w, n, a._replace(lost=True))
        elif op == "next":  # the invocation fails: the platform retries its own event
            self.excuse(w, (a.sid or "", *a.taken))
            if a.kind == "inv" and a.event is not None:
                self.excuse(w, (a.event,))
                self.platform_retry(w, a.event)
            self.replace_actor(w, n, None)
        elif op == "claim":  # the receiver fails: Lambda retries the envelope
            self.deliver_later(w, ("env", a.key, a.sid or "", str(a.token)))
            self.replace_actor(w, n, None)
        else:  # adopt: the sweeper's pass fails; the grant idles until it expires
            self.replace_actor(w, n, None)

    def crash(self, w: World, a: Actor) -> None:
        held = tuple(s for s in (a.sid, *a.taken) if s is not None)
        if a.kind == "inv" and a.event is not None:
            self.excuse(w, (*held, a.event))
            self.platform_retry(w, a.event)
        else:
            self.excuse(w, held)
            if a.kind == "recv" and a.phase == "claim":
                self.deliver_later(w, ("env", a.key, a.sid or "", str(a.token)))

    def check_resend(self, w: World, a: Actor, call: Call, reply: Any) -> None:
        """(h): a resent call that was applied is answered as applied."""
        first, rec = call.first, self.rec(w, a.key)
        bad = False
        if call.op == "acquire" and isinstance(first, LeaseResult) and first.acquired:
            live = rec.owner == first.owner and rec.token == first.token
            same = isinstance(reply, LeaseResult) and reply.acquired
            bad = live and not (same and reply.token == first.token)
        elif call.op in ("claim", "adopt") and isinstance(first, Signal):
            live = rec.owner == first.id and rec.token == first.token
            bad = live and reply != first
        elif call.op == "take" and isinstance(first, tuple) and not isinstance(first, Lost):
            bad = rec.owner == a.sid and rec.token == a.token and reply != first
        elif call.op == "next" and not isinstance(first, Lost):
            bad = isinstance(reply, Lost)
        if bad and w.violation is None:
            w.violation = f"(h) {a.aid}'s resent {call.op} was answered {_show(reply)}"

    # -- invariants -------------------------------------------------------------------------------

    def check(self, w: World) -> str | None:
        if w.violation:
            return w.violation
        for key in self.keys:
            rec = self.rec(w, key)
            believers = [
                a
                for a in w.actors
                if a.key == key and a.phase == "run" and not a.lost and w.now < a.valid_until
            ]
            if len(believers) > 1:
                names = ", ".join(f"{a.aid} on {a.sid}" for a in believers)
                return f"(a) two runs believe they hold {key}: {names}"
            for a in believers:
                if rec.owner != a.sid or rec.token != a.token or rec.expires <= w.now:
                    return (
                        f"(a) {a.aid} believes it holds {key} as {a.sid}@{a.token}, "
                        f"the backend says {rec.owner}@{rec.token}"
                    )
            if rec.owner is None and rec.expires == 0 and rec.queue and not rec.halted:
                return f"(g) {key} was released with {list(rec.queue)} queued (lost wakeup)"
        return None

    def quiescent(self, w: World) -> bool:
        return not w.actors and not w.book.pending and w.book.arrived == self.b.events

    def drain(self, w: World) -> str | None:
        """(c): let time pass and the sweeper and receivers run, without faults, to a
        fixpoint; then every event must be handled, dead-lettered or visibly failed."""
        w = w.copy()
        for _ in range(4 * self.b.events + 4):
            progressed = False
            for key in self.keys:
                rec = self.rec(w, key)
                if rec.owner is not None:
                    if rec.in_flight:
                        self.excuse(w, tuple(rec.in_flight))
                    w.now = max(w.now, rec.expires)
                self.model.observe(rec, w.now)
                signal = self.model.adopt(rec, self.b.ttl, True, f"drain.{w.now}", w.now)
                while signal is not None:
                    progressed = True
                    self.start(w, key, signal.id)
                    w.book = self.handled(w.book, (signal.id,))
                    nxt = self.model.transfer_to_next(
                        rec, signal.id, self.b.ttl, True, signal.token, w.now
                    )
                    signal = nxt if isinstance(nxt, Signal) else None
            if not progressed:
                break
        if w.violation:
            return w.violation
        for sid in self.events:
            i = _idx(sid)
            rec = self.rec(w, self.key_of(sid))
            dead = any(d.id == sid for d in rec.dead)
            held = rec.halted and sid in rec.queue  # visibly waiting for an operator's redrive
            if not (w.book.oks[i] or dead or held or w.book.gave_up[i]):
                return f"(c) {sid} was lost: never handled, not dead-lettered, not failed visibly"
        return None

    # -- search -----------------------------------------------------------------------------------

    def run(self, max_states: int | None = None) -> Result:
        started = time.monotonic()
        result = Result()
        first = self.initial()
        ttl = self.b.ttl
        seen: dict[tuple[Any, ...], tuple[tuple[Any, ...] | None, str]] = {
            first.key(ttl, self.keys): (None, "")
        }
        frontier = deque([first])
        while frontier:
            w = frontier.popleft()
            result.states += 1
            wkey = w.key(ttl, self.keys)
            problem = self.check(w) or (self.drain(w) if self.quiescent(w) else None)
            if problem:
                result.violations += 1
                result.message = problem
                result.trace = self._trace(seen, wkey)
                break
            if max_states is not None and result.states >= max_states:
                break
            for label, nw in self.successors(w):
                result.transitions += 1
                k = nw.key(ttl, self.keys)
                if k not in seen:
                    seen[k] = (wkey, label)
                    frontier.append(nw)
        result.seconds = time.monotonic() - started
        return result

    @staticmethod
    def _trace(
        seen: dict[tuple[Any, ...], tuple[tuple[Any, ...] | None, str]], key: tuple[Any, ...]
    ) -> list[str]:
        steps: list[str] = []
        cur: tuple[Any, ...] | None = key
        while cur is not None:
            parent, label = seen[cur]
            if label:
                steps.append(label)
            cur = parent
        return steps[::-1]


def _show(reply: Any) -> str:
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


PRESETS = {
    # make test: every fault kind, one at a time, over two events (about a minute)
    "small": Bounds(events=2, faults=1, expiries=1, renews=0),
    # make model-check: the same with renewals (a few minutes)
    "default": Bounds(events=2, faults=1, expiries=1),
    # by hand: three events and two faults (hours)
    "deep": Bounds(events=3, faults=2, expiries=1),
    # make test and make model-check: a bounded queue, a poison signal halting its key, and an
    # operator's redrive, over three events (a third forward meets a full queue)
    "queue": Bounds(
        events=3,
        faults=1,
        expiries=0,
        renews=0,
        takes=0,
        max_attempts=1,
        max_queue=1,
        halt=True,
        redrives=1,
        platform_retries=0,
    ),
}

# make model-check: the queue bounds with a platform retry of every refused or failed event
PRESETS["queue-retries"] = replace(PRESETS["queue"], platform_retries=1)


def check_model(
    bounds: Bounds, model: ProtocolModel | None = None, rules: ClientRules | None = None
) -> Result:
    return Explorer(bounds, model, rules).run()


def main(argv: list[str] | None = None) -> int:
    from .mutants import MUTANTS

    parser = argparse.ArgumentParser(
        prog="python -m leaseguard.protocol.explore",
        description="Explore every interleaving of the protocol model under faults.",
    )
    parser.add_argument("--bound", choices=sorted(PRESETS), default="default")
    parser.add_argument("--events", type=int, help="events (overrides the bound)")
    parser.add_argument("--faults", type=int, help="injected faults (overrides the bound)")
    parser.add_argument("--expiries", type=int, help="leases that may run out (overrides)")
    parser.add_argument("--keys", type=int, help="keys (overrides the bound)")
    parser.add_argument("--no-mutants", action="store_true", help="skip the mutant check")
    parser.add_argument("--min-states", type=int, default=0, help="fail below this many states")
    args = parser.parse_args(argv)
    bounds = PRESETS[args.bound]
    overrides = {
        name: value
        for name, value in (
            ("events", args.events),
            ("faults", args.faults),
            ("expiries", args.expiries),
            ("keys", args.keys),
        )
        if value is not None
    }
    bounds = replace(bounds, **overrides)
    print(f"model-check: bounds {bounds}", flush=True)
    result = check_model(bounds)
    print(
        f"model-check: explored {result.states} states, {result.transitions} transitions, "
        f"{result.violations} violations ({result.seconds:.1f} s)"
    )
    failed = False
    if result.violations:
        failed = True
        print(f"VIOLATION {result.message}\nshortest trace:")
        for n, step in enumerate(result.trace, 1):
            print(f"  {n:2}. {step}")
    if result.states < args.min_states:
        failed = True
        print(f"model-check: fewer than the required {args.min_states} states")
    if not args.no_mutants:
        caught = 0
        # Each mutant is checked under the family of bounds that can see its rule.
        family = "queue" if args.bound.startswith("queue") else "core"
        mutants = [m for m in MUTANTS if m.family == family]
        for mutant in mutants:
            found = check_model(bounds, mutant.model(), mutant.rules)
            ok = found.violations > 0
            caught += ok
            verdict = f"caught: {found.message}" if ok else "NOT CAUGHT"
            print(f"  mutant {mutant.name}: {verdict} ({len(found.trace)} steps)")
        print(f"mutants: {caught}/{len(mutants)} caught")
        failed = failed or caught < len(mutants)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
