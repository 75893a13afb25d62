"""The invariants of docs/protocol.md, checked on every state the explorer reaches.

(a) no two handler runs of a key both believe they hold the lease, and a run that believes it
    does is the backend's owner with its token; (b) tokens strictly increase per key; (c) in
    every quiescent state, after the sweeper and retries run to a fixpoint, every event was
    handled successfully, dead-lettered, or visibly failed to the platform; (d) an event runs
    more than once only after a crash, a give-up, a handler error or an expired lease; (e)
    forwarded events start in arrival order per key; (f) a run that held its lease is never told
    it lost it; (g) a released key never keeps queued signals (no lost wakeup); (h) a resent
    call that was applied is answered as applied; (i) on a halted key, nothing queued after its
    dead letter starts; (j) no forward is queued past ``max_queue``; (n) no key holds more
    than ``dead_limit`` dead letters, and a failure past that bound keeps its signal queued on
    the halted key; (o) with a retry delay, a signal sent back to the queue by a failed run
    starts again only after the delay's low end; (p) an invocation whose caller waits
    (``caller_waits``) starts no other event's run after its own event's, so that caller is
    answered after its own run.

Most are checked where the step that could break them happens (a run starting, a grant, a
reply delivered); (a) and (g) on every state; (c) on quiescent states only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leaseguard.signals import Signal
from leaseguard.types import LeaseResult

from .guarded import TICK_MS
from .state import DEAD_LIMIT, KeyRecord, Lost
from .world import Actor, Call, ExplorerBase, World, event_index, show

if TYPE_CHECKING:
    from leaseguard.renewal import LeaseHandle

    from .guarded import RunWait


class Invariants(ExplorerBase):
    """The checks. Each sets ``w.violation`` (the first one found wins) or returns it."""

    def waiting(self, a: Actor) -> RunWait | None:  # the client knows where its actors are
        raise NotImplementedError

    def start(self, w: World, key: str, sid: str) -> None:
        """A handler run begins on ``sid``: (d), (e) and (i) are checked here."""
        book = w.book
        i = event_index(sid)
        runs = self.bump(book.runs, (sid,))
        if runs[i] > 1 + book.excuses[i] and w.violation is None:
            w.violation = f"(d) {sid} runs a second time with no crash, give-up, error or expiry"
        if book.waits and book.waits[i] > w.now and w.violation is None:
            w.violation = (
                f"(o) {sid} runs again {book.waits[i] - w.now} ms before its retry delay is over"
            )
        if book.waits and book.waits[i]:
            w.book = book = book._replace(waits=(*book.waits[:i], 0, *book.waits[i + 1 :]))
        repeat = sid in book.reported and sid not in book.evicted
        if repeat and w.violation is None:
            w.violation = f"(d) {sid} runs again after its runner reported it succeeded"
        if sid in book.enqueued and not book.started[i]:
            for earlier in book.enqueued[: book.enqueued.index(sid)]:
                if (
                    self.key_of(earlier) == key
                    and not book.started[event_index(earlier)]
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

    def check_forgetting(self, w: World, remembered: list[str], now_remembered: Any) -> None:
        """The done memory past its bound (``Bounds.done_limit``): it forgets the oldest ids
        first, and only once full. A forgotten id may run again or be answered lost (its
        dedupe window no longer holds, docs/safety.md), so it is excused for (d) and (f)."""
        forgotten = [sid for sid in remembered if sid not in now_remembered]
        if not forgotten:
            return
        if forgotten != remembered[: len(forgotten)] and w.violation is None:
            w.violation = f"(d) the done memory forgot {forgotten} before {remembered[0]}"
        if len(now_remembered) < self.model.done_limit and w.violation is None:
            w.violation = f"(d) the done memory forgot {forgotten} below its bound"
        self.excuse(w, tuple(forgotten))
        w.book = w.book._replace(evicted=(*w.book.evicted, *forgotten))

    # -- (l): attempts charged only to runs that started ------------------------------------------

    @staticmethod
    def attempts_snapshot(w: World, rec: KeyRecord) -> tuple[Any, ...]:
        """What (l) compares across one step: attempts, dead letters, the grant and whether
        what is in flight has no live owner (then the step's charges are G5's)."""
        attempts = {sid: stored.attempts for sid, stored in rec.stored.items()}
        expired = bool(rec.in_flight) and (rec.owner is None or rec.expires <= w.now)
        return attempts, {d.id for d in rec.dead}, (rec.owner, rec.token, rec.claimed), expired

    def count_attempts(self, w: World, rec: KeyRecord, snapshot: tuple[Any, ...]) -> None:
        """The attempts one step charged, and the run a claimed grant it made may have started
        (the backend cannot tell a claim's crash from the handler's, G5); a redrive's moved
        ids start again from nothing. Counts stop at ``max_attempts + 2``: past that a
        signal is dead, so the comparison (l) makes never needs more."""
        attempts, dead_before, grant, expired = snapshot
        starts, charges = list(w.book.starts), list(w.book.charges)
        ambiguous = w.book.ambiguous
        cap = self.b.max_attempts + 2

        def add(counts: list[int], sid: str, n: int) -> None:
            i = event_index(sid)
            counts[i] = min(counts[i] + n, cap)

        failed_back: list[str] = []  # sent back to the queue by a failed run's report: (o)
        for sid, stored in rec.stored.items():
            if sid in attempts and stored.attempts > attempts[sid]:
                add(charges, sid, stored.attempts - attempts[sid])
                if expired and sid in ambiguous:
                    add(starts, sid, 1)
                if not expired:
                    failed_back.append(sid)
            elif sid in dead_before:  # redriven: a fresh count
                starts[event_index(sid)] = charges[event_index(sid)] = 0
        waits = list(w.book.waits)
        if failed_back and self.b.retry_delay:
            # The guard delays the report's first signal (the head it is handed to: G6 puts
            # them back in in-flight order); the others run behind it, so no later.
            head = rec.owner if rec.owner in failed_back else None
            head = head or next((q for q in rec.queue if q in failed_back), failed_back[0])
            until = w.now + self.least_retry_delay(rec.stored[head].attempts)
            for sid in failed_back:
                waits[event_index(sid)] = until
        for dead in rec.dead:
            before = attempts.get(dead.id)
            # at max_attempts already, the guard dead-letters it unrun: no run is charged
            if dead.id not in dead_before and before is not None and before < self.b.max_attempts:
                add(charges, dead.id, dead.attempts - before)
        for sid, done in rec.done.items():
            if sid in attempts and sid not in rec.stored and not done.ok:
                add(charges, sid, max(done.attempts - attempts[sid], 0))  # left to the platform
        live = rec.owner is not None and rec.claimed and rec.owner in rec.in_flight
        if live and (rec.owner, rec.token, rec.claimed) != grant:
            add(starts, rec.owner, 1)  # type: ignore[arg-type]
        if ambiguous:
            ambiguous = tuple(sid for sid in ambiguous if sid in rec.in_flight)
        w.book = w.book._replace(
            starts=tuple(starts), charges=tuple(charges), ambiguous=ambiguous, waits=tuple(waits)
        )

    def least_retry_delay(self, attempts: int) -> int:
        """(o): the shortest wait the guard's ``retry_delay_ms`` allows before run
        ``attempts + 1``: half the doubled delay (the jitter's low end), capped."""
        from leaseguard.guard.retries import DEFAULT_RETRY_MAX_DELAY_MS

        nominal = (self.b.retry_delay * TICK_MS) << max(attempts - 1, 0)
        return min(DEFAULT_RETRY_MAX_DELAY_MS, nominal) // 2

    @staticmethod
    def reported(w: World, succeeded: tuple[str, ...]) -> None:
        """A runner's step applied after its runs of ``succeeded`` returned: the step reports
        them (a take's ``completed``, a hand-off's completion), so no crash excuses another
        run of them."""
        new = tuple(sid for sid in succeeded if sid not in w.book.reported)
        if new:
            w.book = w.book._replace(reported=(*w.book.reported, *new))

    @staticmethod
    def taken_unseen(w: World, sids: list[str]) -> None:
        """A take applied: until its reply reaches the taker, the backend cannot tell a taker
        that is slow, gave up or died with them from one whose handler has them, so the
        lease running out charges them as started runs (G5)."""
        new = tuple(sid for sid in sids if sid not in w.book.ambiguous)
        w.book = w.book._replace(ambiguous=(*w.book.ambiguous, *new))

    @staticmethod
    def taken_seen(w: World, sids: list[str]) -> None:
        """The take's reply reached the taker: from here its runs say what started."""
        ambiguous = tuple(sid for sid in w.book.ambiguous if sid not in sids)
        w.book = w.book._replace(ambiguous=ambiguous)

    def possessed(self, w: World, sids: tuple[str, ...] | list[str]) -> None:
        """Signals handed to a run from a take: a batch item whose run began, or what a
        handler's ``take_signals`` returned (or would have, to a taker that died first)."""
        starts, cap = list(w.book.starts), self.b.max_attempts + 2
        for sid in sids:
            starts[event_index(sid)] = min(starts[event_index(sid)] + 1, cap)
        w.book = w.book._replace(starts=tuple(starts))

    def check_attempts(self, w: World) -> str | None:
        """(l): a signal is charged an attempt only for a run of it that started (as the
        backend can know it: a claimed grant, a batch item run, a take its handler got) and
        did not succeed; the last run of a signal that ends done succeeded, so it is not one."""
        for sid in self.events:
            i = event_index(sid)
            rec = self.rec(w, self.key_of(sid))
            done = rec.done.get(sid)
            finished = sid not in rec.stored and not any(d.id == sid for d in rec.dead)
            succeeded = finished and (done.ok if done is not None else w.book.oks[i])
            # (a signal done without a run that started is lost work, which (c) reports)
            allowed = max(w.book.starts[i] - (1 if succeeded else 0), 0)
            if w.book.charges[i] > allowed:
                return (
                    f"(l) {sid} was charged {w.book.charges[i]} attempts for {allowed} runs "
                    "that started and did not succeed"
                )
        return None

    def check_dead_bound(
        self, w: World, rec: KeyRecord, op: str, attempts: dict[str, int], stored: set[str]
    ) -> None:
        """(n) at a step (``attempts``: the stored signals' counts before it): a signal that
        left the key's storage was completed, dead-lettered, or (its invocation's own event,
        below ``max_attempts``) left to the platform's retry; a report that took a signal to
        ``max_attempts`` without dead-lettering it (no room) halted the key."""
        if w.violation is not None:
            return
        dead = {d.id for d in rec.dead}
        # a done memory at its bound may have forgotten an id this very step completed
        full = len(rec.done) >= self.model.done_limit
        for sid in stored - set(rec.stored) - dead:
            done = rec.done.get(sid)
            left = done is not None and (done.ok or done.attempts < self.b.max_attempts)
            if not left and not full:
                w.violation = f"(n) {sid} left the backend: not completed, not dead-lettered"
                return
        if op != "transfer_to_next" or rec.halted:
            return
        for sid, kept in rec.stored.items():  # queued, or already handed the key
            was = attempts.get(sid, 0)
            if was < self.b.max_attempts <= kept.attempts:
                w.violation = (
                    f"(n) {sid} reached max_attempts, was not dead-lettered, and the key "
                    "was not halted"
                )
                return

    def check_tokens(self, w: World, before: list[tuple[str | None, int]]) -> None:
        """(b): every new grant carries a larger token than any before it on that key."""
        for (owner, token), rec in zip(before, w.recs, strict=True):
            granted = rec.owner is not None and (rec.owner, rec.token) != (owner, token)
            if (rec.token < token or (granted and rec.token == token)) and w.violation is None:
                w.violation = f"(b) {rec.owner} was granted token {rec.token} after {token}"

    def check_queue_bound(self, w: World, sid: str, known: bool, reply: Any) -> None:
        """(j): a forward the backend did not know before is never queued past the bound."""
        queued = isinstance(reply, LeaseResult) and reply.position is not None
        if queued and not known and reply.position > self.b.max_queue and not w.violation:
            w.violation = f"(j) {sid} was queued at {reply.position}, past max_queue"

    @staticmethod
    def superseded(rec: KeyRecord, owner: str, token: int | None) -> bool:
        """The done memory keeps one entry per id, the newest: once ``owner`` failed and then
        ran and finished again under a later grant (its own event's platform retry, or a
        redrive's run), a resend of the earlier grant's report finds the later token there
        and is answered lost (docs/protocol.md, (h): not fixed; the run had failed already)."""
        done = rec.done.get(owner)
        return done is not None and token is not None and done.token > token

    def check_lost_reply(self, w: World, a: Actor, call: Call, handle: LeaseHandle) -> None:
        """(f): ``transfer_to_next`` answered lost to a run that still held its lease."""
        held = call.sent_at / TICK_MS < handle._valid_until and handle.lost_reason is None
        held = held and handle.grant_owner not in w.book.evicted
        held = held and not self.superseded(self.rec(w, a.key), handle.grant_owner, handle.token)
        if held and w.violation is None:
            w.violation = (
                f"(f) {a.aid} held its lease on {handle.grant_owner} but transfer_to_next said lost"
            )

    def check_resend(self, w: World, a: Actor, call: Call, reply: Any) -> None:
        """(h): a resent call that was applied is answered as applied."""
        first, rec = call.first, self.rec(w, a.key)
        bad = False
        if call.op == "acquire_or_enqueue" and isinstance(first, LeaseResult) and first.acquired:
            live = rec.owner == first.owner and rec.token == first.token
            same = isinstance(reply, LeaseResult) and reply.acquired
            bad = live and not (same and reply.token == first.token)
        elif call.op in ("claim_signal", "adopt_orphans") and isinstance(first, Signal):
            live = rec.owner == first.id and rec.token == first.token
            bad = live and reply != first
        elif call.op == "take_signals" and isinstance(first, list):
            owner, token = call.args
            bad = rec.owner == owner and rec.token == token and reply != first
        elif call.op == "transfer_to_next" and not isinstance(first, Lost):
            # past its bound the done memory may have forgotten this owner (docs/safety.md)
            bad = isinstance(reply, Lost) and call.args[0] not in w.book.evicted
            bad = bad and not self.superseded(rec, call.args[0], call.args[1])
        if bad and w.violation is None:
            w.violation = f"(h) {a.aid}'s resent {call.op} was answered {show(reply)}"

    def check(self, w: World) -> str | None:
        """The violation found so far, else (a) and (g) on this state."""
        if w.violation:
            return w.violation
        for key in self.keys:
            rec = self.rec(w, key)
            believers = []
            for a in w.actors:
                wait = self.waiting(a) if a.key == key else None
                if wait is None or wait.handle.lost_reason is not None:
                    continue
                if w.now / TICK_MS < wait.handle._valid_until:
                    believers.append((a, wait.handle))
            if len(believers) > 1:
                names = ", ".join(f"{a.aid} on {h.grant_owner}" for a, h in believers)
                return f"(a) two runs believe they hold {key}: {names}"
            for a, handle in believers:
                owner = handle.grant_owner
                if rec.owner != owner or rec.token != handle.token or rec.expires <= w.now:
                    return (
                        f"(a) {a.aid} believes it holds {key} as {owner}@{handle.token}, "
                        f"the backend says {rec.owner}@{rec.token}"
                    )
            if rec.owner is None and rec.expires == 0 and rec.queue and not rec.halted:
                return f"(g) {key} was released with {list(rec.queue)} queued (lost wakeup)"
            limit = DEAD_LIMIT if self.b.dead_limit is None else self.b.dead_limit
            if len(rec.dead) > limit:
                return f"(n) {key} holds {len(rec.dead)} dead letters, past its bound of {limit}"
        return None

    def quiescent(self, w: World) -> bool:
        return not w.actors and not w.book.pending and w.book.arrived == self.b.events

    def settled(self, w: World) -> str | None:
        """The checks of a quiescent state: (l) on it, then (c) after its fixpoint."""
        return self.check_attempts(w) or self.drain(w)

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
                signal = self.model.adopt(rec, self.ttl_ms, True, f"drain.{w.now}", w.now)
                while signal is not None:
                    progressed = True
                    self.start(w, key, signal.id)
                    w.book = self.handled(w.book, (signal.id,))
                    nxt = self.model.transfer_to_next(
                        rec, signal.id, self.ttl_ms, True, signal.token, w.now
                    )
                    signal = nxt if isinstance(nxt, Signal) else None
            if not progressed:
                break
        if w.violation:
            return w.violation
        for sid in self.events:
            i = event_index(sid)
            rec = self.rec(w, self.key_of(sid))
            dead = any(d.id == sid for d in rec.dead)
            held = rec.halted and sid in rec.queue  # visibly waiting for an operator's redrive
            if not (w.book.oks[i] or dead or held or w.book.gave_up[i]):
                return f"(c) {sid} was lost: never handled, not dead-lettered, not failed visibly"
        return None
