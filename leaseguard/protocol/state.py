"""The data the protocol's steps act on: one key's record, the replies and failure reports that
cross the step boundary, and the limits every backend shares.

:class:`KeyRecord` is one key's whole state (its fields are the Redis hash / DynamoDB attribute
names) and what can be read off it without changing it: who holds it, a stored signal as its
handler gets it, the reply of its current grant, its view for an operator.
:mod:`leaseguard.protocol.model` holds the steps that change it. The constants are the
protocol's limits, read by the guard and every provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from leaseguard.signals import decode_signal
from leaseguard.types import DeadLetter, KeyState, LeaseResult, Signal

DEDUPE_WINDOW_MS = 300_000
"""How long a completed signal id is remembered: a resend or redelivery of it within this
window answers "duplicate" instead of running it again (SQS FIFO's window is the same)."""
DONE_LIMIT = 1_000
"""At most this many completed ids are remembered per key (the oldest are forgotten first)."""
DEFAULT_MAX_ATTEMPTS = 3
"""A forwarded signal whose handler failed this many times is dead-lettered."""
TOKEN_MEMORY_MS = 60_000
"""An idle key (no owner, nothing queued, in flight, dead-lettered or remembered as done) is
forgotten this long after it went idle; its next token then comes from the clock floor."""
MAX_ERROR_CHARS = 1_000
DEAD_LIMIT = 100
"""At most this many dead letters are kept per key (row G6). A failure that would dead-letter
a signal on a key already holding this many keeps the signal at the head of the queue, with
its count, and halts the key until an operator redrives: failed work is never dropped, and a
key's storage (DynamoDB's 400 KB lease item above all) stays bounded."""
DEFAULT_MAX_QUEUE = 1_000
"""A forward into a key whose queue already holds this many signals is refused (row Q8)."""


class Lost(NamedTuple):
    """The reply of an owner-side step made by a caller that does not hold the key."""

    holder: str | None


class Full(NamedTuple):
    """The reply of a forward refused because the key's queue is at its bound (row Q8).
    ``sized``: the bound was the room the backend's storage leaves, below ``max_queue``."""

    holder: str | None
    depth: int
    sized: bool = False


@dataclass(frozen=True)
class Failure:
    """How the owner's run ended when it did not succeed (an argument of ``transfer_to_next``).

    Every signal the owner holds in flight failed with it: the owner's own signal and the ones
    it took. Each goes back to the head of the queue with one more attempt, or to the key's
    dead-letter list once it reached ``max_attempts``. ``requeue_owner=False`` is for an owner
    whose signal is the invocation's *own* event: the invocation re-raises, so the platform
    retries that event; it is removed here and not remembered as done. ``halt`` (the guard's
    ``on_poison="halt"``): a signal dead-lettered by this report halts the key, so nothing
    queued behind it runs until an operator redrives it (row G6, V1).

    A *partial* report (``completed`` not None, row G8) comes from the guard's batch drain:
    the ids in ``completed`` ran and succeeded (they are done), those in ``failed`` failed as
    above, and every other id in flight never ran (a batch cut short, or taken by a
    ``take_signals`` whose reply was lost): it goes back to the head of the queue, its count
    unchanged.
    """

    error: str
    requeue_owner: bool = True
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    halt: bool = False
    completed: tuple[str, ...] | None = None
    failed: tuple[str, ...] = ()

    def verdict(self, sid: str) -> str:
        """What this report says of in-flight signal ``sid``: ``"failed"``, or, in a partial
        report (``completed`` given, row G8), ``"ok"`` for the ids in ``completed``,
        ``"failed"`` for those in ``failed`` and ``"unrun"`` for every other id."""
        if self.completed is None or sid in self.failed:
            return "failed"
        return "ok" if sid in self.completed else "unrun"


@dataclass
class Stored:
    record: str  # leaseguard.signals.encode_signal text
    attempts: int = 0


@dataclass(frozen=True)
class Done:
    token: int  # the grant under which it completed (names the owner's step for resends)
    at: int
    ok: bool  # False: it failed and went back to the queue or the platform (no dedupe)
    attempts: int = 0  # a failed own event's failed runs so far: its platform retry resumes them


@dataclass(frozen=True)
class Redriven:
    """The last redrive that moved something (row V1): a resend of it (the same nonce) answers
    ``moved`` again and changes nothing (V3). Forgotten like a done entry (G2)."""

    nonce: str
    moved: int
    at: int


@dataclass(frozen=True)
class DeadEntry:
    id: str
    record: str
    attempts: int
    error: str
    at: int


@dataclass
class KeyRecord:
    """One key's state. Field letters are the Redis hash / DynamoDB attribute names."""

    owner: str | None = None  # o
    token: int = 0  # t: last token issued; kept after release and expiry
    expires: int = 0  # owner's deadline; 0 after a release (not an expiry)
    claimed: bool = True  # c
    grant_nonce: str | None = None  # w: the call that made or claimed this grant
    prev: str | None = None  # p: the owner that handed over or released last
    prev_token: int | None = None  # pt: its token
    take_nonce: str | None = None  # k
    take_count: int = 0  # kn
    queue: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)
    stored: dict[str, Stored] = field(default_factory=dict)  # queued and in flight
    dead: list[DeadEntry] = field(default_factory=list)
    done: dict[str, Done] = field(default_factory=dict)  # oldest first
    idle_since: int = 0
    halted: bool = False  # h: a dead letter under on_poison="halt" stops the queue
    redriven: Redriven | None = None  # r: the last redrive that moved something (V1, V3)

    def clone(self) -> KeyRecord:
        return KeyRecord(
            self.owner,
            self.token,
            self.expires,
            self.claimed,
            self.grant_nonce,
            self.prev,
            self.prev_token,
            self.take_nonce,
            self.take_count,
            list(self.queue),
            list(self.in_flight),
            {k: Stored(v.record, v.attempts) for k, v in self.stored.items()},
            list(self.dead),
            dict(self.done),
            self.idle_since,
            self.halted,
            self.redriven,
        )

    def freeze(self, now: int) -> tuple[object, ...]:
        """A hashable image of everything the protocol can observe, with times relative to
        ``now`` (the explorer's state: two worlds that differ only in when they happen are one)."""
        if self.owner is not None:
            expires = max(self.expires - now, 0)
        else:
            expires = 0 if self.expires == 0 else -1  # released, or expired
        return (
            self.owner,
            self.token,
            expires,
            self.claimed,
            self.grant_nonce,
            self.prev,
            self.prev_token,
            self.take_nonce,
            self.take_count,
            tuple(self.queue),
            tuple(self.in_flight),
            tuple(sorted((k, v.attempts) for k, v in self.stored.items())),
            tuple((d.id, d.attempts) for d in self.dead),
            self.halted,
            None if self.redriven is None else (self.redriven.nonce, self.redriven.moved),
            # the done memory last: the explorer's canonical form (world.py) reads it there
            tuple((k, v.token, v.ok, v.attempts) for k, v in self.done.items()),
        )

    @property
    def has_work(self) -> bool:
        return bool(self.queue or self.in_flight)

    def forgettable(self, now: int) -> bool:
        return (
            self.owner is None
            and not self.has_work
            and not self.dead
            and not self.done
            and self.redriven is None
            and self.idle_since <= now - TOKEN_MEMORY_MS
        )

    def holds(self, owner: str, token: int | None) -> bool:
        return self.owner == owner and (token is None or self.token == token)

    def signal(self, sid: str, token: int | None = None) -> Signal:
        """A stored signal (queued or in flight) as a handler receives it."""
        stored = self.stored[sid]
        return decode_signal(sid, stored.record, token, stored.attempts)

    def stored_new(self, sid: str, record: str) -> Stored:
        """A signal stored anew: a failed own event's retry resumes its attempt count."""
        done = self.done.get(sid)
        return Stored(record, done.attempts if done is not None and not done.ok else 0)

    def granted(self, sid: str) -> LeaseResult:
        """The reply of a grant that is the current lease (first run or recognised resend)."""
        owner = self.owner
        if owner is None:  # every caller grants first; a free key here is a bug in the model
            raise RuntimeError("granted() called on a free key")
        if owner == sid:
            stored = self.stored.get(sid)
            return LeaseResult(True, owner, self.token, attempts=stored.attempts if stored else 0)
        return LeaseResult(True, owner, self.token, adopted=self.signal(owner, self.token))

    def view(self, key: str, now: int) -> KeyState:
        """What ``inspect`` shows an operator, once the record was observed at ``now``."""
        live = self.owner is not None
        return KeyState(
            key=key,
            owner=self.owner,
            token=self.token if live else None,
            remaining_ms=self.expires - now if live else None,
            queued=tuple(self.signal(sid) for sid in self.queue),
            in_flight=tuple(self.in_flight),
            dead_letters=tuple(dead_letter(d) for d in self.dead),
            halted=self.halted,
        )


def dead_letter(entry: DeadEntry) -> DeadLetter:
    """How a dead-lettered entry is shown to an operator (``inspect``)."""
    signal = decode_signal(entry.id, entry.record)
    return DeadLetter(
        id=entry.id,
        payload=signal.payload,
        attempts=entry.attempts,
        error=entry.error,
        enqueued_at_ms=signal.enqueued_at_ms,
        failed_at_ms=entry.at,
    )
