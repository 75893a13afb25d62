"""The guard's own flow, run one step at a time where the model checker says.

The explorer does not simulate the client: every invocation, envelope receiver and sweeper it
explores is the code that ships, :func:`leaseguard.guard.drivers.drive_sync` over
:class:`leaseguard.guard.flow.Invocation` (with its drain, renewals, failure reports and
hand-offs) or :func:`leaseguard.handoff.dispatch_orphans`. Only the world around it is the
explorer's, through the guard's seams:

* the **provider** is an :class:`~leaseguard.providers.memory.InMemoryLeaseProvider` (the
  model behind the provider API, with the base's validation and the reply conversions that
  ship) whose :meth:`~ExplorerProvider._step` does not apply a step but hands it to the
  explorer, which applies it to the world's record when its search says, and delivers the
  reply, a lost reply and its resend, or a give-up (``LeaseBackendError``), later;
* the **clock** is the explorer's time (``GuardedHandler.clock``);
* the **renewer** (``renewer_class``) renews when the search says, by its own ``_renew_once``;
* the **Lambda context** says how much time is left, as the search chooses (so the handoff
  policy that ships decides between inline and an envelope), and the **dispatcher** hands
  envelopes to the explorer's platform;
* the **handler** is the user's code: it takes signals through ``current_lease()``, returns or
  raises, as the search chooses.

A Python generator cannot be copied, so an actor's state is its *script*: every input it was
given (replies, choices, each with the time it arrived). To move an actor, the flow runs again
from the start on its script, answered from it without touching the world, until it asks for
what the script does not hold yet (stateless search, as Loom and CHESS do it); the result is
memoised per script, so most moves are one dictionary lookup. The world's identity hashes each
actor's script with times relative to now and tokens relative to the key's, so equivalent
states are still explored once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from leaseguard.errors import LeaseBackendError, LeaseguardError
from leaseguard.guard.call import Call as HandlerCall
from leaseguard.guard.drivers import drive_sync
from leaseguard.guard.flow import Invocation
from leaseguard.guard.handler import GuardedHandler
from leaseguard.guard.options import GuardOptions
from leaseguard.guard.policy import HandoffPolicy
from leaseguard.handoff import Dispatcher, Envelope, dispatch_orphans
from leaseguard.observability import Telemetry
from leaseguard.providers.memory import InMemoryLeaseProvider, Step, T
from leaseguard.renewal import LeaseHandle, current_lease
from leaseguard.renewer import LeaseRenewer
from leaseguard.types import KeyState, Signal

from .model import ProtocolModel

TICK_MS = 1_000
"""One step of the explorer's clock, in the model's milliseconds (the guard sees seconds)."""
TAKE_LIMIT = 10  # what the simulated handler asks take_signals for
ADOPT_LIMIT = 10  # what the sweeper asks adopt_orphans for
PLENTY_MS = 10**9  # a Lambda deadline far away: the policy runs the next signal inline
GIVE_UP = "give-up"
"""The reply of a call whose caller gave up (every retry timed out) although it applied."""


class Input(NamedTuple):
    """One thing an actor was given: a backend reply (``reply``), what its handler does next
    (``act``: ``ok``, ``raise``, ``take``, ``renew``) or the time left to its invocation
    (``time_left``, milliseconds). ``now`` is the explorer's time when it arrived."""

    kind: str
    now: int
    value: Any


@dataclass(frozen=True)
class CallWait:
    """The flow made a backend call: ``apply(record, now, nonce)`` is its step."""

    op: str
    args: tuple[Any, ...]
    apply: Step[Any]
    handle: LeaseHandle | None  # the grant the caller runs under, if any


@dataclass(frozen=True)
class RunWait:
    """The handler runs on ``sid`` under ``handle``, having taken ``ids[1:]`` so far."""

    sid: str
    handle: LeaseHandle
    ids: tuple[str, ...]
    takes: int
    renews: int


@dataclass(frozen=True)
class TimeLeftWait:
    """The handoff policy asks the Lambda context how much time is left."""


@dataclass(frozen=True)
class Finished:
    """The invocation returned (``error`` None) or raised ``error``."""

    error: BaseException | None


Wait = CallWait | RunWait | TimeLeftWait | Finished


@dataclass(frozen=True)
class Advance:
    """Where an actor's script leads: what it waits for, and what happened on the way that
    the explorer had not seen yet (the last input's consequences)."""

    wait: Wait
    started: tuple[str, ...]  # handler runs that began (the handler was called)
    envelopes: tuple[Envelope, ...]  # envelopes dispatched
    held: tuple[str, ...]  # what the actor answers for now: its grant's runs and takes
    misnamed: tuple[str, ...] = ()  # runs whose current_lease() named another signal (m)
    # signals it was handed to run that the backend counts as started from a take (l): a batch
    # item when its run began, what a handler's take_signals returned when it returned
    possessed: tuple[str, ...] = ()
    succeeded: tuple[str, ...] = ()  # every run of this actor whose handler returned, so far
    # runs an invocation whose caller waits began after its own event's run, before it answered
    # (p): other callers' events it made that caller wait for
    late: tuple[str, ...] = ()


class ActorSpec(NamedTuple):
    """What an actor is, apart from its script: an invocation of an event, a receiver of an
    envelope, or a sweeper pass."""

    kind: str  # inv | recv | sweep
    key: str
    event: str | None  # an invocation's event id
    owner: str | None  # a receiver's envelope: the grant's owner and token
    token: int | None
    born: int  # when it started (the explorer's time)


class _Suspend(BaseException):
    """Unwinds the flow where its script ends (a BaseException: the flow catches Exception)."""

    def __init__(self, wait: Wait) -> None:
        super().__init__()
        self.wait = wait


class HandlerFailure(Exception):
    """What the simulated handler raises when the search makes it fail."""


class _Replay:
    """One run of an actor's flow on its script."""

    def __init__(self, spec: ActorSpec, script: tuple[Input, ...]) -> None:
        self.script = script
        self.pos = 0
        self.now = spec.born
        self.started: list[str] = []
        self.envelopes: list[Envelope] = []
        self.handle: LeaseHandle | None = None
        self.held: list[str] = []
        self.renewer: ExplorerRenewer | None = None
        self.misnamed: list[str] = []
        self.possessed: list[str] = []
        self.succeeded: list[str] = []
        self.own = spec.event if spec.kind == "inv" else None
        self.own_ran = False  # the invocation's own event ran (in this replay, fresh or not)
        self.late: list[str] = []

    @property
    def fresh(self) -> bool:
        """Past the script: what happens now is new to the explorer."""
        return self.pos >= len(self.script)

    def next_input(self, kind: str, wait: Callable[[], Wait]) -> Any:
        if self.pos >= len(self.script):
            raise _Suspend(wait())
        given = self.script[self.pos]
        if given.kind != kind:  # pragma: no cover - a nondeterministic flow
            raise AssertionError(f"replay diverged: the flow asks {kind}, the script has {given}")
        self.pos += 1
        self.now = given.now
        return given.value


class ExplorerProvider(InMemoryLeaseProvider):
    """The provider API over the explorer's world: each step goes to the explorer."""

    def __init__(self, driver: GuardDriver, model: ProtocolModel) -> None:
        super().__init__(model=model)
        self.driver = driver

    def _step(self, key: str, op: str, args: tuple[object, ...], apply: Step[T]) -> T:
        replay = self.driver.replay
        value = replay.next_input("reply", lambda: CallWait(op, args, apply, replay.handle))
        if value == GIVE_UP:
            raise LeaseBackendError(f"{op}: no reply (the request applied; every retry timed out)")
        return value  # type: ignore[no-any-return]

    def _take(
        self,
        key: str,
        owner: str,
        limit: int,
        token: int | None = None,
        completed: tuple[str, ...] = (),
    ) -> list[Signal]:
        taken = super()._take(key, owner, limit, token, completed)
        # The reply says the report applied: what it named is done, so a crash from here on
        # excuses no second run of it (d): it must never run again.
        replay = self.driver.replay
        replay.held = [sid for sid in replay.held if sid not in completed]
        return taken

    def _inspect(self, key: str) -> KeyState:
        # The guard reads which of its last-attempt signals the key dead-lettered (the rest
        # were kept, the list being full): a step like any other, whose reply may be late,
        # lost or given up on.
        model = self.model
        return self._step(key, "inspect_key", (), lambda rec, now, _: model.inspect(rec, key, now))

    def _orphan_keys(self) -> list[str]:
        return [self.driver.spec.key]

    def _pending(self, key: str) -> int:
        # Only read for a log line after a lost lease; a read is no step of the protocol.
        raise LeaseBackendError("the model checker answers no read-only lookups")


class ExplorerRenewer(LeaseRenewer):
    """The renewer without its thread: renewals happen when the search says (``renew``)."""

    driver: GuardDriver  # set on the subclass each driver makes (the flow builds renewers)

    def __init__(self, handle: LeaseHandle | None, every_ms: int) -> None:
        super().__init__(handle, every_ms)
        self.driver.replay.renewer = self

    def follow(self, handle: LeaseHandle) -> None:
        self.handle = self._last = handle

    def pause(self) -> None:
        self.handle = None  # a renewal is never in flight here: the actor waits for it

    def stop(self) -> None:
        self.pause()
        self._stopping = True


class _Context:
    """The Lambda context the flow reads: its deadline is the search's choice."""

    invoked_function_arn = "arn:aws:lambda:model-check:0:function:guarded"
    function_name = "guarded"
    aws_request_id = "model-check"

    def __init__(self, driver: GuardDriver) -> None:
        self.driver = driver

    def get_remaining_time_in_millis(self) -> int:
        value: int = self.driver.replay.next_input("time_left", TimeLeftWait)
        return value


class _Dispatcher:
    def __init__(self, driver: GuardDriver) -> None:
        self.driver = driver

    def dispatch(self, envelope: Envelope) -> None:
        replay = self.driver.replay
        if replay.fresh:
            replay.envelopes.append(envelope)


class _Policy(HandoffPolicy):
    def __init__(self, options: GuardOptions, dispatcher: Dispatcher) -> None:
        super().__init__(options)
        self._dispatcher = dispatcher

    def dispatcher(self, context: Any) -> Dispatcher:
        return self._dispatcher


class GuardDriver:
    """Runs actors' flows on their scripts, memoising where each script leads."""

    def __init__(
        self,
        model: ProtocolModel,
        options: GuardOptions,
        key_of: Callable[[str], str],
        provider_class: type[ExplorerProvider] = ExplorerProvider,
    ) -> None:
        self.model = model
        self.options = options
        self.key_of = key_of
        self.provider = provider_class(self, model)
        self.dispatcher = _Dispatcher(self)
        self.context = _Context(self)
        quiet = logging.Logger("leaseguard.model-check", logging.CRITICAL + 1)
        self.guard = GuardedHandler(
            self._handler,
            lambda event: key_of(event["id"]),
            self.provider,
            options,
            Telemetry(quiet),
        )
        self.guard.policy = _Policy(options, self.dispatcher)
        self.guard.clock = lambda: self.replay.now / TICK_MS
        self.guard.renewer_class = type("DriverRenewer", (ExplorerRenewer,), {"driver": self})
        self.replay = _Replay(ActorSpec("none", "", None, None, None, 0), ())
        self.spec = ActorSpec("none", "", None, None, None, 0)
        self._memo: dict[tuple[Any, ...], Advance] = {}

    def advance(self, spec: ActorSpec, script: tuple[Input, ...], memo_key: Any) -> Advance:
        """Where ``script`` leads actor ``spec`` (``memo_key``: the script, hashable)."""
        key = (spec, memo_key)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._run(spec, script)
        return found

    def _run(self, spec: ActorSpec, script: tuple[Input, ...]) -> Advance:
        self.spec, replay = spec, _Replay(spec, script)
        self.replay = replay
        wait: Wait
        try:
            if spec.kind == "sweep":
                dispatch_orphans(self.provider, self.dispatcher, self.options.ttl_ms, ADOPT_LIMIT)
            else:
                if spec.kind == "inv":
                    event: dict[str, Any] = {"id": spec.event}
                else:
                    assert spec.owner is not None and spec.token is not None
                    event = Envelope(spec.key, spec.owner, spec.token).to_event()
                call = HandlerCall((event, self.context), {}, 0, self.context)
                drive_sync(self._handler, Invocation(self.guard, call))
            wait = Finished(None)
        except _Suspend as suspended:
            wait = suspended.wait
        except Exception as exc:
            wait = Finished(exc)
        return Advance(
            wait,
            tuple(replay.started),
            tuple(replay.envelopes),
            tuple(replay.held),
            tuple(replay.misnamed),
            tuple(replay.possessed),
            tuple(replay.succeeded),
            tuple(replay.late),
        )

    def _handler(self, event: Any, context: Any) -> str:
        """The user's handler, as the search makes it behave."""
        replay = self.replay
        handle = current_lease()
        sid = str(event["id"])
        last = replay.handle
        if last is None or (last.grant_owner, last.token) != (handle.grant_owner, handle.token):
            replay.held = []  # a new grant: what the last one held was reported
        replay.handle = handle
        replay.held.append(sid)
        if replay.own_ran and self.options.handoff.caller_waits and replay.fresh:
            replay.late.append(sid)
        replay.own_ran = replay.own_ran or sid == replay.own
        if replay.fresh:
            replay.started.append(sid)
            if handle.owner != sid:  # the id a downstream write dedupes on (docs/safety.md)
                replay.misnamed.append(f"{sid} (current_lease().owner is {handle.owner})")
            if handle.grant_owner != sid:  # a batch item: its take did not start it, this does
                replay.possessed.append(sid)
        ids, takes, renews = [sid], 0, 0
        while True:
            act = replay.next_input("act", partial(RunWait, sid, handle, tuple(ids), takes, renews))
            if act == "take":
                takes += 1
                try:
                    taken = handle.take_signals(TAKE_LIMIT)
                except LeaseguardError:
                    # A handler that carries on without them (the search may also make it let
                    # the error propagate): what the take moved may be in flight unseen, and
                    # the guard must neither complete it nor charge it.
                    continue
                ids += [s.id for s in taken]
                replay.held += [s.id for s in taken]
                if replay.fresh:
                    replay.possessed += [s.id for s in taken]
            elif act == "renew":
                renews += 1
                renewer = replay.renewer
                if renewer is not None and renewer.handle is not None:  # the grant it follows
                    renewer._renew_once(renewer.handle)
            elif act == "raise":
                raise HandlerFailure(f"the handler failed on {sid}")
            else:
                replay.succeeded += ids
                return "ok"
