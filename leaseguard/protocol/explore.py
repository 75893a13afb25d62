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
invariants in docs/protocol.md, (a) to (j) in :mod:`leaseguard.protocol.invariants`.

The explorer is built in layers, one module each: :mod:`~leaseguard.protocol.world` (a state
and its canonical key), :mod:`~leaseguard.protocol.invariants` (the checks),
:mod:`~leaseguard.protocol.client` (the actors), and this module (the platform's and the
environment's moves, the search, the command line); :mod:`~leaseguard.protocol.bounds` says
how far a search looks.

Mutants (:mod:`leaseguard.protocol.mutants`) break one rule each; every one must be caught, or
the invariants are vacuous.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from .bounds import PRESETS, Bounds, ClientRules
from .client import Client
from .model import ProtocolModel
from .mutants import MUTANTS
from .world import Actor, World, event_index

__all__ = ["PRESETS", "Bounds", "ClientRules", "Explorer", "Result", "check_model", "main"]


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
            label = self.spawn(nw, Actor(sid, "inv", self.key_of(sid), sid, "start", None))
            yield f"event {sid} arrives: {label}", nw
        for n, item in enumerate(book.pending):
            nw = w.copy()
            nw.book = book._replace(pending=book.pending[:n] + book.pending[n + 1 :])
            if item[0] == "e":
                sid = item[1]
                i = event_index(sid)
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

    # -- search -----------------------------------------------------------------------------------

    def run(self, max_states: int | None = None) -> Result:
        started = time.monotonic()
        result = Result()
        first = self.initial()
        ttl = self.b.ttl
        first_key = first.key(ttl, self.keys)
        seen: dict[tuple[Any, ...], tuple[tuple[Any, ...] | None, str]] = {first_key: (None, "")}
        # each world waits with its key, computed once when it was first reached
        frontier = deque([(first, first_key)])
        while frontier:
            w, wkey = frontier.popleft()
            result.states += 1
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
    bounds: Bounds, model: ProtocolModel | None = None, rules: ClientRules | None = None
) -> Result:
    return Explorer(bounds, model, rules).run()


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
