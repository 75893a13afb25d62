"""The simulated guard client: every actor that talks to the backend, step by step.

Invocations follow the guard's flow (``acquire_or_enqueue`` -> run -> ``take_signals``/renew ->
``transfer_to_next`` -> the next signal inline, an envelope to a receiver, or done); receivers
claim hand-off envelopes; the sweeper adopts orphaned work. Every call is two transitions,
*apply* (the model's step) and *deliver* (what the reply does to the caller), so other actors
and time can move while a reply is on the wire, and a fault can strike in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from leaseguard.types import LeaseResult

from .invariants import Invariants
from .state import Failure, Full, Lost
from .world import Actor, Call, World, show

LIMIT = 10  # take_signals batch size


class Client(Invariants):
    """How each actor moves: its calls, what their replies do to it, and its faults."""

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
            self.check_queue_bound(w, args[0], known, reply)
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

    def send(self, w: World, a: Actor, op: str, args: tuple[Any, ...], phase: str) -> Actor:
        # Unique per call; the state's key never shows it (see World.key).
        nonce = f"{a.aid}.{a.seq}.{w.now}.{self.rec(w, a.key).token}"
        reply = self.apply(w, a, op, args, nonce)
        return a._replace(
            phase=phase, call=Call(op, args, nonce, w.now, reply, reply, False), seq=a.seq + 1
        )

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
        for how, nw, done, failure in self.run_ends(w, a, faults_left):
            if done.lost or nw.now >= done.valid_until:
                self.finish(nw, n, done)
                yield f"{how}; its lease is lost: no hand-off", nw
                continue
            rec = self.rec(nw, a.key)
            # Inline or by envelope only differ when there is someone to hand to.
            hands_off = bool(rec.queue) or (
                failure is not None and len(rec.in_flight) > (a.sid == a.event)
            )
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

    def run_ends(
        self, w: World, a: Actor, faults_left: bool
    ) -> Iterator[tuple[str, World, Actor, Failure | None]]:
        """How a run can end, each with its world, its actor and the report its
        ``transfer_to_next`` sends. Besides the handler succeeding or raising on the whole run
        (its own signal and what its handler took), the guard's batch drain (row G8): taken
        signals run one by one, so one of them can fail after the ones before it succeeded,
        and a drain whose ``take_signals`` failed reports its runs done and the rest unrun."""
        name, m, halt = a.aid, self.b.max_attempts, self.b.halt
        done = a._replace(phase="next")
        if a.spent:
            nw = w.copy()
            how = f"{name} dead-letters {a.sid} unrun (its earlier runs never finished)"
            yield how, nw, done, Failure("handler failed", a.sid != a.event, m, halt)
            return
        if a.error and self.rules.partial_reports:  # its take_signals failed
            nw = w.copy()
            ran = (a.sid or "", *a.taken)
            nw.book = self.handled(nw.book, ran)
            how = f"{name} drain's take_signals failed: {ran} done, the rest unrun"
            yield how, nw, done, Failure("take failed", True, m, halt, completed=ran)
        if a.error and self.rules.failed_take_fails_run:
            # A handler's take may have moved signals it never saw: the run fails, which
            # retries them instead of completing them.
            nw = w.copy()
            how = f"{name} run ends failed (its take_signals failed)"
            yield how, nw, done, Failure("handler failed", a.sid != a.event, m, halt)
            return
        nw = w.copy()
        nw.book = self.handled(nw.book, (a.sid, *a.taken))
        yield f"{name} handler finishes {a.sid} (+{len(a.taken)} taken)", nw, done, None
        if not faults_left:
            return
        nw = w.copy()
        self.fault(nw)
        self.excuse(nw, (a.sid or "", *a.taken))
        own = a.kind == "inv" and a.sid == a.event
        failed = done._replace(error=True, own_error=a.own_error or own)
        how = f"FAULT {name} handler raises on {a.sid}"
        yield how, nw, failed, Failure("handler failed", a.sid != a.event, m, halt)
        if not self.rules.partial_reports:
            return
        for i, sid in enumerate(a.taken):
            nw = w.copy()
            self.fault(nw)
            ran = (a.sid or "", *a.taken[:i])
            nw.book = self.handled(nw.book, ran)
            self.excuse(nw, a.taken[i:])  # the failed one, and the rest that never ran
            how = f"FAULT {name}'s drain: {sid} raises after {ran} (partial report)"
            report = Failure("handler failed", True, m, halt, completed=ran, failed=(sid,))
            yield how, nw, done._replace(error=True), report

    def reply_steps(
        self, w: World, n: int, a: Actor, faults_left: bool
    ) -> Iterator[tuple[str, World]]:
        call = a.call
        assert call is not None
        nw = w.copy()
        self.deliver(nw, n, a._replace(call=None), call, call.reply)
        yield f"{a.aid} gets the reply of {call.op}: {show(call.reply)}", nw
        if not faults_left or call.op in ("peek", "enqueue"):
            return
        if not call.resent:
            nw = w.copy()
            self.fault(nw)
            reply = self.apply(nw, a, call.op, call.args, call.nonce)
            self.check_resend(nw, a, call, reply)
            self.replace_actor(nw, n, a._replace(call=call._replace(reply=reply, resent=True)))
            yield f"FAULT {a.aid}'s reply of {call.op} is lost; resent: {show(reply)}", nw
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
                self.check_lost_reply(w, a, call)
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
