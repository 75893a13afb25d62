"""Exhaustive explicit-state search of the protocol model and the guard's own code.

``make model-check`` runs ``python -m leaseguard.protocol.explore``. The world is the model's
key records plus every actor that talks to them, each running the code that ships
(:mod:`~leaseguard.protocol.guarded`): invocations and envelope receivers run
``leaseguard.guard``'s flow through its sync driver, the sweeper runs
``leaseguard.handoff.dispatch_orphans``. Around them the search moves the platform (retries of
failed invocations and envelopes, duplicate deliveries) and the environment (time, and faults,
each counted against a budget: a reply lost after the step applied and then resent with the
same nonce, a caller that gives up after the step applied, a crash at any point, a handler that
raises).

Every call is two transitions, *apply* and *deliver*, so other actors (and time) can move while
a reply is on the wire. Breadth-first search finds the shortest trace to any violation of the
invariants in docs/protocol.md (:mod:`leaseguard.protocol.invariants`).

Layers, one module each: :mod:`~leaseguard.protocol.world` (a state and its canonical key),
:mod:`~leaseguard.protocol.invariants` (the checks), :mod:`~leaseguard.protocol.guarded` (the
guard's seams and the replay of its flow), :mod:`~leaseguard.protocol.client` (which inputs
each actor may get next), and this module (the platform's and the environment's moves, the
search, the command line); :mod:`~leaseguard.protocol.bounds` says how far a search looks.

Mutants (:mod:`leaseguard.protocol.mutants`) break one rule each, in the model, the provider's
steps or the guard's source; every one must be caught, or the invariants are vacuous.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from . import failover
from .bounds import PRESETS, Bounds
from .client import Client
from .guarded import TICK_MS, ActorSpec, ExplorerProvider
from .model import ProtocolModel
from .mutants import MUTANTS, Mutant
from .world import World, event_index

__all__ = ["PRESETS", "Bounds", "Explorer", "Result", "check_model", "check_mutant", "main"]


# The mutants each bound must catch: the families of rules it can see.
FAMILIES = {
    "small": ("core",),
    "default": ("core",),
    "deep": ("core",),
    "queue": ("queue",),
    "queue-retries": ("queue",),
    "drain": ("drain", "memory"),
    "failover": ("failover",),
    "dead": ("dead",),
    "dead-faults": ("dead",),
    "waiting": ("core", "waiting"),
}


@dataclass
class Result:
    states: int = 0
    transitions: int = 0
    violations: int = 0
    trace: list[str] = field(default_factory=list)
    message: str | None = None
    seconds: float = 0.0


class Explorer(Client):
    """Breadth-first search over every interleaving of the actors, the platform and time."""

    # -- transitions ----------------------------------------------------------------------------

    def successors(self, w: World) -> Iterator[tuple[str, World]]:
        b, book = self.b, w.book
        faults_left = book.faults < b.faults
        if book.arrived < b.events:
            sid = self.events[book.arrived]
            nw = w.copy()
            nw.book = book._replace(arrived=book.arrived + 1)
            yield from self.spawn(nw, sid, self.invocation(nw, sid), f"event {sid} arrives")
        for n, item in enumerate(book.pending):
            nw = w.copy()
            nw.book = book._replace(pending=book.pending[:n] + book.pending[n + 1 :])
            if item[0] == "e":
                sid = item[1]
                i = event_index(sid)
                retries = list(nw.book.retries)
                retries[i] += 1
                nw.book = nw.book._replace(retries=tuple(retries))
                label = f"platform redelivers {sid}"
                yield from self.spawn(nw, f"{sid}r{retries[i]}", self.invocation(nw, sid), label)
                continue
            _, key, owner, token = item
            spec = ActorSpec("recv", key, None, owner, int(token), nw.now)
            yield from self.spawn(
                nw, self.receiver_id(nw, owner), spec, "platform delivers an envelope"
            )
            if faults_left:
                cw = nw.copy()
                self.fault(cw)
                cw.book = cw.book._replace(pending=(*cw.book.pending, item))
                yield from self.spawn(
                    cw,
                    self.receiver_id(cw, owner),
                    spec,
                    "FAULT platform delivers an envelope twice",
                )
        if faults_left:
            for sid in self.events[: book.arrived]:
                nw = w.copy()
                nw.book = book._replace(faults=book.faults + 1)
                aid = f"{sid}d{book.faults}"
                label = f"FAULT platform delivers {sid} again"
                yield from self.spawn(nw, aid, self.invocation(nw, sid), label)
        if faults_left and w.undo:
            yield from self.failover_steps(w)
        if book.redrives < b.redrives:
            for key in self.keys:
                if self.rec(w, key).dead:
                    yield from self.redrive(w, key)
        for n, (key, nonce, moved) in enumerate(book.resends):
            nw = w.copy()
            nw.book = book._replace(resends=book.resends[:n] + book.resends[n + 1 :])
            rec = self.rec(nw, key)
            snapshot = self.attempts_snapshot(nw, rec)
            again = self.model.redrive(rec, None, nw.now, nonce)
            self.count_attempts(nw, rec, snapshot)
            if again != moved and nw.violation is None:
                nw.violation = (
                    f"(h) the operator's resent redrive of {key} said {again}, not {moved}"
                )
            yield f"the operator's redrive of {key} is resent: {again} moved", nw
        for key in self.keys:
            rec = self.rec(w, key)
            orphaned = (rec.owner is None or rec.expires <= w.now) and rec.has_work
            orphaned = orphaned and not rec.halted
            if orphaned and not any(a.kind == "sweep" and a.key == key for a in w.actors):
                nw = w.copy()
                spec = ActorSpec("sweep", key, None, None, None, nw.now)
                yield from self.spawn(nw, f"sw.{key}", spec, "sweeper")
        expiring = [r for r in w.recs if r.owner is not None and r.expires <= w.now + TICK_MS]
        if not expiring or book.expiries < b.expiries:
            nw = w.copy()
            nw.now += TICK_MS
            if expiring:
                nw.book = nw.book._replace(expiries=book.expiries + 1)
            for rec in nw.recs:
                if rec.owner is not None and rec.expires <= nw.now:
                    self.excuse(nw, tuple(rec.in_flight))
                self.model.observe(rec, nw.now)
            yield f"time {nw.now // TICK_MS}" + (" (a lease runs out)" if expiring else ""), nw
        for n, a in enumerate(w.actors):
            yield from self.actor_steps(w, n, a, faults_left)

    def redrive(self, w: World, key: str) -> Iterator[tuple[str, World]]:
        """The operator's ``leaseguard redrive`` (row V1); its reply may be lost, and then the
        same call is resent later, after anything else (V3). The loss is not charged to the
        fault budget: a dead letter to redrive already took a fault (a failed run)."""
        nonce = f"op{w.book.redrives}"
        nw = w.copy()
        nw.book = w.book._replace(redrives=w.book.redrives + 1)
        rec = self.rec(nw, key)
        snapshot = self.attempts_snapshot(nw, rec)
        if nw.undo:
            failover.forget(nw, self.keys.index(key))
        moved = self.model.redrive(rec, None, nw.now, nonce)
        self.count_attempts(nw, rec, snapshot)
        yield f"operator redrives {key}: {moved} back at the head", nw
        lost = nw.copy()
        lost.book = lost.book._replace(resends=(*lost.book.resends, (key, nonce, moved)))
        yield f"FAULT the reply of the operator's redrive of {key} ({moved}) is lost", lost

    def invocation(self, w: World, sid: str) -> ActorSpec:
        return ActorSpec("inv", self.key_of(sid), sid, None, None, w.now)

    @staticmethod
    def receiver_id(w: World, owner: str) -> str:
        aid = f"r.{owner}"
        while any(x.aid == aid for x in w.actors):
            aid += "+"
        return aid

    # -- search -----------------------------------------------------------------------------------

    def run(self, max_states: int | None = None) -> Result:
        started = time.monotonic()
        result = Result()
        first = self.initial()
        ttl = self.ttl_ms
        first_key = first.key(ttl, self.keys, self.validity)
        seen: dict[tuple[Any, ...], tuple[tuple[Any, ...] | None, str]] = {first_key: (None, "")}
        # each world waits with its key, computed once when it was first reached
        frontier = deque([(first, first_key)])
        while frontier:
            w, wkey = frontier.popleft()
            result.states += 1
            problem = self.check(w) or (self.settled(w) if self.quiescent(w) else None)
            if problem:
                result.violations += 1
                result.message = problem
                result.trace = self._trace(seen, wkey)
                break
            if max_states is not None and result.states >= max_states:
                break
            for label, nw in self.successors(w):
                result.transitions += 1
                if nw.violation is not None:
                    # A violation found by a transition: its state may equal one seen already
                    # (the key does not hold the violation), so it is reported here.
                    result.violations += 1
                    result.message = nw.violation
                    result.trace = [*self._trace(seen, wkey), label]
                    frontier.clear()
                    break
                k = nw.key(ttl, self.keys, self.validity)
                if k not in seen:
                    seen[k] = (wkey, label)
                    frontier.append((nw, k))
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


def check_model(
    bounds: Bounds,
    model: ProtocolModel | None = None,
    provider_class: type[ExplorerProvider] = ExplorerProvider,
) -> Result:
    return Explorer(bounds, model, provider_class).run()


def check_mutant(bounds: Bounds, mutant: Mutant) -> Result:
    """Explore ``mutant``: its model, its provider and its change to the guard's source."""
    with mutant.applied():
        return check_model(bounds, mutant.model(), mutant.provider_class)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leaseguard.protocol.explore",
        description="Explore every interleaving of the protocol model under faults.",
    )
    parser.add_argument("--bound", choices=sorted(PRESETS), default="default")
    parser.add_argument("--events", type=int, help="events (overrides the bound)")
    parser.add_argument("--faults", type=int, help="injected faults (overrides the bound)")
    parser.add_argument("--expiries", type=int, help="leases that may run out (overrides)")
    parser.add_argument("--keys", type=int, help="keys (overrides the bound)")
    parser.add_argument(
        "--retry-delay", type=int, help="the guard's retry_delay_ms in ticks (overrides)"
    )
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
            ("retry_delay", args.retry_delay),
        )
        if value is not None
    }
    bounds = replace(bounds, **overrides)
    # The search keeps every visited state alive and makes few reference cycles: at the
    # default thresholds the collector rescans that growing set over and over for garbage it
    # rarely finds (about a quarter of a bound's time). Collected seldom, it finds the same.
    gc.set_threshold(100_000, 50, 100)
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
        families = FAMILIES.get(args.bound, ("core",))
        mutants = [m for m in MUTANTS if m.family in families]
        for mutant in mutants:
            found = check_mutant(bounds, mutant)
            ok = found.violations > 0
            caught += ok
            verdict = f"caught: {found.message}" if ok else "NOT CAUGHT"
            print(f"  mutant {mutant.name}: {verdict} ({len(found.trace)} steps)")
        print(f"mutants: {caught}/{len(mutants)} caught")
        failed = failed or caught < len(mutants)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
