"""The explorer's actors: the guard's own flow (and the sweeper's), moved one input at a time.

Each actor is a script for :class:`~leaseguard.protocol.guarded.GuardDriver`, which runs the
code that ships on it; this module decides which inputs the search may give next and keeps the
invariants' books. A call the flow makes is applied to the world at once (it is on the wire);
its reply is delivered as a later transition, or lost and resent, or given up on, so other
actors and time can move in between. While a handler runs, it may finish, raise, take signals
or have its lease renewed; a crash can end any actor at any point.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from leaseguard.guard.options import GuardOptions, HandoffConfig, RetryConfig
from leaseguard.guard.retries import DEFAULT_RETRY_MAX_DELAY_MS

from . import failover
from .bounds import Bounds
from .guarded import (
    GIVE_UP,
    PLENTY_MS,
    TICK_MS,
    ActorSpec,
    Advance,
    CallWait,
    ExplorerProvider,
    Finished,
    GuardDriver,
    Input,
    RunWait,
    TimeLeftWait,
)
from .invariants import Invariants
from .model import ProtocolModel
from .state import Lost
from .world import Actor, Call, World, hashable, show

Moves = Iterator[tuple[str, World]]


class Client(Invariants):
    """How each actor can move, and what each move does to the books."""

    def __init__(
        self,
        bounds: Bounds | None = None,
        model: ProtocolModel | None = None,
        provider_class: type[ExplorerProvider] = ExplorerProvider,
    ) -> None:
        super().__init__(bounds, model)
        b = self.b
        options = GuardOptions(
            ttl_ms=self.ttl_ms,
            renew_every_ms=max(self.ttl_ms // 3, 1),
            handoff=HandoffConfig(drain_batch=b.drain_batch, caller_waits=b.caller_waits),
            retries=RetryConfig(
                max_attempts=b.max_attempts,
                delay_ms=b.retry_delay * TICK_MS,
                max_delay_ms=DEFAULT_RETRY_MAX_DELAY_MS,
                on_poison="halt" if b.halt else "skip",
            ),
            max_queue=b.max_queue,
            signal_id_fn=lambda event, context: str(event["id"]),
        )
        self.driver = GuardDriver(self.model, options, self.key_of, provider_class)
        self._serials = itertools.count()

    def advanced(self, a: Actor) -> Advance:
        if a.adv is None:  # a new actor
            return self.driver.advance(a.spec, a.script, a.trail)
        return a.adv

    def given(self, a: Actor, given: Input) -> Actor:
        """``a`` with one more input, and where its flow goes from there."""
        script = (*a.script, given)
        trail = (*a.trail, (given.kind, given.now, hashable(given.value)))
        return a._replace(
            script=script, trail=trail, adv=self.driver.advance(a.spec, script, trail)
        )

    def validity(self, a: Actor, now: int) -> int | None:
        """How long the grant ``a`` runs under is still valid as the guard sees it (ms from
        ``now``; -1 once lost or run out; None without one)."""
        wait = self.advanced(a).wait
        handle = wait.handle if isinstance(wait, (RunWait, CallWait)) else None
        if handle is None:
            return None
        left = round(handle._valid_until * TICK_MS) - now
        return -1 if handle.lost_reason is not None or left <= 0 else left

    def waiting(self, a: Actor) -> RunWait | None:
        """The handler run ``a`` is in, if it is in one (and not waiting for a reply)."""
        if a.call is not None:
            return None
        wait = self.advanced(a).wait
        return wait if isinstance(wait, RunWait) else None

    # -- actors starting and moving -----------------------------------------------------------

    def spawn(self, w: World, aid: str, spec: ActorSpec, label: str) -> Moves:
        """A new actor runs until it first waits (its first call is applied at once)."""
        a = Actor(aid, spec, next(self._serials))
        a = a._replace(adv=self.advanced(a))
        w.actors = (*w.actors, a)
        yield from self.proceed(w, len(w.actors) - 1, a, label)

    def proceed(self, w: World, n: int, a: Actor, label: str) -> Moves:
        """``a`` (at index ``n``, its script just grown) runs on to what it waits for next."""
        adv = self.advanced(a)
        wait = adv.wait
        for sid in adv.started:
            self.start(w, a.key, sid)
        self.possessed(w, adv.possessed)
        if adv.misnamed and w.violation is None:
            w.violation = f"(m) the run of {adv.misnamed[0]}"
        if adv.late and w.violation is None:
            w.violation = (
                f"(p) {a.aid}, whose caller waits, ran {adv.late[0]} after its own event "
                "before answering"
            )
        for envelope in adv.envelopes:
            self.deliver_later(w, ("env", envelope.key, envelope.owner, str(envelope.token)))
        if isinstance(wait, TimeLeftWait):
            rec = self.rec(w, a.key)
            # The deadline only matters when there is someone to hand to.
            near = bool(rec.queue) or len(rec.in_flight) > 1
            for left in (PLENTY_MS, 0) if near else (PLENTY_MS,):
                nw = w.copy()
                na = self.given(a, Input("time_left", w.now, left))
                how = "" if not near else (" [time left]" if left else " [deadline near]")
                yield from self.proceed(nw, n, na, label + how)
            return
        if isinstance(wait, CallWait):
            nonce = f"n{a.serial}.{len(a.script)}"
            reply = self.apply_call(w, a, wait.op, wait.apply, nonce)
            call = Call(wait.op, wait.args, nonce, w.now, reply, reply, False, wait.apply).heard()
            self.replace_actor(w, n, a._replace(call=call))
            yield f"{label}; {a.aid} {wait.op}{_args(wait.args)}", w
            return
        if isinstance(wait, Finished):
            self.finished(w, n, a, wait.error)
            end = "" if wait.error is None else f" (raised {type(wait.error).__name__})"
            yield f"{label}; {a.aid} ends{end}", w
            return
        self.replace_actor(w, n, a)
        yield f"{label}; {a.aid} runs the handler on {wait.sid}", w

    def apply_call(self, w: World, a: Actor, op: str, apply: Any, nonce: str) -> Any:
        rec = self.rec(w, a.key)
        before = set(rec.stored)
        remembered = list(rec.done)
        grants = [(r.owner, r.token) for r in w.recs]
        snapshot = self.attempts_snapshot(w, rec)
        undo = (rec.clone(), w.book) if w.undo else None
        reply = apply(rec, w.now, nonce)
        self.count_attempts(w, rec, snapshot)
        self.check_dead_bound(w, rec, op, snapshot[0], before)
        if op == "take_signals" and isinstance(reply, list):
            self.taken_unseen(w, [s.id for s in reply])
        if op in ("take_signals", "transfer_to_next") and not isinstance(reply, Lost):
            self.reported(w, self.advanced(a).succeeded)
        self.check_forgetting(w, remembered, rec.done)
        if op in ("acquire_or_enqueue", "enqueue") and a.event is not None:
            self.check_queue_bound(w, a.event, a.event in before, reply)
        for sid in rec.queue:
            if sid not in before and sid not in w.book.enqueued:
                w.book = w.book._replace(enqueued=(*w.book.enqueued, sid))
        self.check_tokens(w, grants)
        if undo is not None:
            failover.kept(w, self.keys.index(a.key), undo[0], a.aid, nonce, undo[1])
        return reply

    def actor_steps(self, w: World, n: int, a: Actor, faults_left: bool) -> Moves:
        if faults_left:
            nw = w.copy()
            self.fault(nw)
            self.crash(nw, a)
            self.replace_actor(nw, n, None)
            yield f"FAULT {a.aid} crashes", nw
        if a.call is not None:
            yield from self.reply_steps(w, n, a, faults_left)
            return
        wait = self.waiting(a)
        if wait is not None:
            yield from self.run_steps(w, n, a, wait, faults_left)

    def run_steps(self, w: World, n: int, a: Actor, wait: RunWait, faults_left: bool) -> Moves:
        handle, name = wait.handle, a.aid
        rec = self.rec(w, a.key)
        lost = handle.lost_reason is not None or w.now / TICK_MS >= handle._valid_until
        if wait.sid in self.events[: self.b.poison]:
            # a poison signal: every run of it raises, and that takes no fault
            nw = w.copy()
            self.excuse(nw, wait.ids)
            yield from self.act(nw, n, a, "raise", f"{name} handler raises on poison {wait.sid}")
        else:
            nw = w.copy()
            nw.book = self.handled(nw.book, wait.ids)
            yield from self.act(nw, n, a, "ok", f"{name} handler finishes {', '.join(wait.ids)}")
        if faults_left:
            nw = w.copy()
            self.fault(nw)
            self.excuse(nw, wait.ids)
            yield from self.act(nw, n, a, "raise", f"FAULT {name} handler raises on {wait.sid}")
        if handle.take_failed:  # a take raised: the handler may let its error propagate
            label = f"{name} handler lets the failed take's error propagate"
            nw = w.copy()
            self.excuse(nw, wait.ids)
            yield from self.act(nw, n, a, "raise", label)
        if wait.takes < self.b.takes and not lost and rec.queue:
            yield from self.act(w.copy(), n, a, "take", f"{name} handler takes signals")
        # A renewal in the same tick as the grant or the last renewal changes nothing.
        if (
            wait.renews < self.b.renews
            and not lost
            and handle._valid_until < (w.now + self.ttl_ms) / TICK_MS
        ):
            yield from self.act(w.copy(), n, a, "renew", f"{name}'s lease is renewed")

    def act(self, w: World, n: int, a: Actor, what: str, label: str) -> Moves:
        yield from self.proceed(w, n, self.given(a, Input("act", w.now, what)), label)

    def reply_steps(self, w: World, n: int, a: Actor, faults_left: bool) -> Moves:
        call = a.call
        assert call is not None
        label = f"{a.aid} gets the reply of {call.op}: {show(call.reply)}"
        yield from self.deliver(w.copy(), n, a, call, call.reply, label)
        if not faults_left or call.op in ("get_lease_owner", "enqueue"):
            return
        if not call.resent:
            nw = w.copy()
            self.fault(nw)
            reply = self.apply_call(nw, a, call.op, call.apply, call.nonce)
            self.check_resend(nw, a, call, reply)
            resent = call._replace(reply=reply, resent=True).heard()
            self.replace_actor(nw, n, a._replace(call=resent))
            yield f"FAULT {a.aid}'s reply of {call.op} is lost; resent: {show(reply)}", nw
        nw = w.copy()
        self.fault(nw)
        self.excuse(nw, self.answers_for(a))
        label = f"FAULT {a.aid} gives up on {call.op} (it was applied)"
        yield from self.deliver(nw, n, a, call, GIVE_UP, label)

    def deliver(self, w: World, n: int, a: Actor, call: Call, value: Any, label: str) -> Moves:
        if w.undo and value != GIVE_UP:
            failover.acknowledged(w, call.nonce)
        wait = self.advanced(a).wait
        handle = wait.handle if isinstance(wait, CallWait) else None
        in_time = (
            handle is not None
            and handle.lost_reason is None
            and w.now / TICK_MS < handle._valid_until
        )
        if call.op == "take_signals" and isinstance(value, list) and in_time:
            # a reply that came after the lease ran out runs nothing: still unseen
            self.taken_seen(w, [s.id for s in value])
        if call.op == "transfer_to_next" and isinstance(value, Lost):
            wait = self.advanced(a).wait
            if isinstance(wait, CallWait) and wait.handle is not None:
                self.check_lost_reply(w, a, call, wait.handle)
        na = self.given(a, Input("reply", w.now, value))._replace(call=None)
        yield from self.proceed(w, n, na, label)

    # -- endings --------------------------------------------------------------------------------

    def answers_for(self, a: Actor) -> tuple[str, ...]:
        """What may run again if ``a`` stops now: its grant's runs and takes, and an
        invocation's own event (the platform retries it)."""
        held = self.advanced(a).held
        return (*held, a.event) if a.kind == "inv" and a.event is not None else held

    def finished(self, w: World, n: int, a: Actor, error: BaseException | None) -> None:
        """The invocation returned or raised: a raise is the platform's to retry (the event,
        or for a receiver the envelope, as Lambda retries an async invocation)."""
        if error is not None:
            self.retry_invocation(w, a)
        self.replace_actor(w, n, None)

    def failover_steps(self, w: World) -> Moves:
        """A failover loses a key's last write: its caller, if still waiting, sees an error."""
        keep = self.model.failover_keeps_acknowledged
        for index, last in failover.failovers(w, keep):
            nw = w.copy()
            self.fault(nw)
            failover.restore(nw, index, last)
            key = self.keys[index]
            waiting = [
                (n, a)
                for n, a in enumerate(nw.actors)
                if a.aid == last.aid and a.call is not None and a.call.nonce == last.nonce
            ]
            label = f"FAULT failover: {key}'s replica lacks {last.aid}'s last write"
            if not waiting:
                yield label, nw
                continue
            n, a = waiting[0]
            self.excuse(nw, self.answers_for(a))
            assert a.call is not None
            yield from self.deliver(nw, n, a, a.call, GIVE_UP, label + f"; {a.aid} sees an error")

    def crash(self, w: World, a: Actor) -> None:
        self.excuse(w, self.answers_for(a))
        self.retry_invocation(w, a)

    def retry_invocation(self, w: World, a: Actor) -> None:
        spec = a.spec
        if spec.kind == "inv" and spec.event is not None:
            self.platform_retry(w, spec.event)
        elif spec.kind == "recv" and spec.owner is not None:
            self.deliver_later(w, ("env", spec.key, spec.owner, str(spec.token)))


def _args(args: tuple[Any, ...]) -> str:
    shown = [
        show(v) if not isinstance(v, (str, int)) or isinstance(v, bool) else str(v)
        for v in args
        if v is not None
    ]
    return f"({', '.join(shown)})"
