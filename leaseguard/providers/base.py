"""One base for every provider: it validates, the backend modules only store.

Each public method checks its arguments (raising
:class:`~leaseguard.errors.InvalidLeaseArgument` before any I/O) and then calls the matching
``_``-prefixed method that a backend implements. A backend therefore never sees a bad key, TTL
or payload, and every backend accepts exactly the same inputs.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import ClassVar, Literal

from leaseguard.errors import InvalidLeaseArgument
from leaseguard.protocol.model import (
    DEAD_LIMIT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_QUEUE,
    MAX_ERROR_CHARS,
    Failure,
)
from leaseguard.signals import encode_signal
from leaseguard.types import KeyState, LeaseResult, Signal
from leaseguard.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    check_key,
    check_limit,
    check_owner,
    check_positive_int,
    check_ttl,
)

MAX_TOKEN = 2**63 - 1
MAX_QUEUE_LIMIT = 1_000_000
OnPoison = Literal["skip", "halt"]
ON_POISON = ("skip", "halt")


def new_nonce() -> str:
    """Names one call of a protocol step. A client resends a request whose reply was lost (a
    dropped connection after the backend applied it); the step finds its own nonce stored and
    answers what it did the first time, instead of taking its own effect for someone else's."""
    return os.urandom(8).hex()


class BaseLeaseProvider(ABC):
    """Validation and the public surface shared by the built-in providers.

    ``atomic_transfer`` is true when :meth:`transfer_lease` moves the lease with no moment
    where the key is free; every built-in backend can do that. ``partial_reports``: see
    below.
    """

    atomic_transfer: ClassVar[bool] = True
    partial_reports: ClassVar[bool] = True
    """:meth:`transfer_to_next` takes ``completed=`` and ``failed=`` (docs/protocol.md, row
    G8), which the guard's batch drain needs."""

    def __init__(
        self,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_queue: int = DEFAULT_MAX_QUEUE,
        dead_limit: int = DEAD_LIMIT,
    ) -> None:
        self.max_payload_bytes = check_positive_int(
            "max_payload_bytes", max_payload_bytes, self._payload_ceiling()
        )
        self.max_queue = check_positive_int("max_queue", max_queue, MAX_QUEUE_LIMIT)
        # Dead letters a key keeps (row G6): below DEAD_LIMIT only, never above it, since the
        # DynamoDB lease item's room (docs/dynamodb.md) is reckoned with DEAD_LIMIT of them.
        self.dead_limit = check_positive_int("dead_limit", dead_limit, DEAD_LIMIT)

    @classmethod
    def _payload_ceiling(cls) -> int:
        return 64 * 1024 * 1024

    # -- the lease contract ---------------------------------------------------------------------

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return self._acquire(check_key(key), check_owner(owner), check_ttl(ttl_ms))

    def get_lease_owner(self, key: str) -> str | None:
        return self._get_owner(check_key(key))

    def release_lease(self, key: str, owner: str) -> None:
        self._release(check_key(key), check_owner(owner))

    def renew_lease(self, key: str, owner: str, ttl_ms: int, *, token: int | None = None) -> bool:
        """``token``: renew only the grant with this fencing token (see :func:`check_token`)."""
        return self._renew(
            check_key(key), check_owner(owner), check_ttl(ttl_ms), check_token(token)
        )

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_owner(from_owner, "from_owner")
        if check_owner(to_owner, "to_owner") == from_owner:
            # A resend of it could not be told from a second call (docs/protocol.md, T3).
            raise InvalidLeaseArgument("transfer_lease: to_owner must differ from from_owner")
        return self._transfer(check_key(key), from_owner, to_owner, check_ttl(ttl_ms))

    # -- the signal queue -----------------------------------------------------------------------

    def acquire_or_enqueue(
        self, key: str, signal: Signal, ttl_ms: int, *, max_queue: int | None = None
    ) -> LeaseResult:
        """``max_queue`` (default: the provider's): a forward into a queue that already holds
        that many signals raises :class:`~leaseguard.errors.QueueFull` and stores nothing."""
        check_key(key)
        record = self._check_signal(signal)
        bound = self.max_queue if max_queue is None else max_queue
        return self._acquire_or_enqueue(
            key,
            signal,
            record,
            check_ttl(ttl_ms),
            check_positive_int("max_queue", bound, MAX_QUEUE_LIMIT),
        )

    def take_signals(
        self,
        key: str,
        owner: str,
        limit: int,
        *,
        token: int | None = None,
        completed: Sequence[str] = (),
    ) -> list[Signal]:
        """``completed``: signals this grant holds in flight that ran and succeeded since its
        last report (row K1): they are done before the next ones are taken, so a crash later
        in the grant neither runs them again nor charges them an attempt (G5). The guard's
        batch drain reports each item this way before taking the next. It needs ``token``."""
        reported = _check_ids("completed", completed) if completed else ()
        if reported and token is None:
            raise InvalidLeaseArgument("take_signals with completed= needs token=")
        if len(reported) > MAX_REPORTED_IDS:
            raise InvalidLeaseArgument(f"take_signals reports at most {MAX_REPORTED_IDS} ids")
        args = (check_key(key), check_owner(owner), check_limit(limit), check_token(token))
        if not reported:  # a provider written before completed= existed still takes
            return self._take(*args)
        return self._take(*args, completed=reported)

    def transfer_to_next(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        claim: bool = True,
        token: int | None = None,
        error: str | None = None,
        requeue_owner: bool = True,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        on_poison: OnPoison = "skip",
        completed: Sequence[str] | None = None,
        failed: Sequence[str] = (),
    ) -> Signal | None:
        """``error`` (the failure's text) says the owner's run failed: every signal it holds
        in flight goes back to the head of the queue with one more attempt, or is
        dead-lettered at ``max_attempts``; ``requeue_owner=False`` leaves the owner's own
        signal to the platform's retry instead (docs/protocol.md, row G6). A failure report
        needs the grant's ``token``. ``on_poison="halt"``: a signal dead-lettered by this
        report halts the key (nothing queued runs until :meth:`redrive`); ``"skip"`` (the
        default) lets the key move on.

        ``completed`` makes the report partial (row G8, what a batch drain sends): the ids in
        it ran and succeeded, the ids in ``failed`` failed with ``error`` (as above), and
        every other signal in flight never ran and goes back to the head of the queue with
        its attempts unchanged. It needs ``token``; ``failed`` needs ``completed`` and
        ``error``."""
        if on_poison not in ON_POISON:
            raise InvalidLeaseArgument(f"on_poison must be one of {ON_POISON}, got {on_poison!r}")
        ran, failing = _check_partial(completed, failed, error)
        failure = None
        if error is not None or ran is not None:
            if error is not None and not isinstance(error, str):
                raise InvalidLeaseArgument(f"error must be a str or None, got {type(error)}")
            if token is None:
                # Without the grant's token a resent report could not be told from a new one
                # once the same id owns the key again (docs/protocol.md, N4).
                what = "error=" if error is not None else "completed="
                raise InvalidLeaseArgument(f"transfer_to_next with {what} needs token=")
            text = "unrun" if error is None else error
            failure = Failure(
                text.encode("utf-8", "replace").decode("utf-8")[:MAX_ERROR_CHARS] or "error",
                _check_bool("requeue_owner", requeue_owner),
                check_positive_int("max_attempts", max_attempts, 1000),
                halt=on_poison == "halt",
                completed=ran,
                failed=failing,
            )
        return self._transfer_to_next(
            check_key(key),
            check_owner(owner),
            check_ttl(ttl_ms),
            _check_bool("claim", claim),
            check_token(token),
            failure,
        )

    def claim_signal(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        return self._claim(
            check_key(key),
            check_owner(owner),
            check_positive_int("token", token, MAX_TOKEN),
            check_ttl(ttl_ms),
        )

    def pending_signals(self, key: str) -> int:
        return self._pending(check_key(key))

    def adopt_orphans(
        self, ttl_ms: int, limit: int, *, claim: bool = False
    ) -> list[tuple[str, Signal]]:
        return self._adopt(check_ttl(ttl_ms), check_limit(limit), _check_bool("claim", claim))

    def inspect_key(self, key: str) -> KeyState:
        return self._inspect(check_key(key))

    # -- dead letters -----------------------------------------------------------------------------

    def redrive(self, key: str, ids: Iterable[str] | None = None) -> int:
        """Put the key's dead letters (all, or those with these ``ids``) back at the head of
        its queue, in the order they failed, with their attempts reset, and resume a halted
        key; returns how many moved. A free key's redriven work is run by its next event or
        by ``adopt_orphans`` (the sweeper). A resend of the call whose reply was lost (the
        client's own retry, with the same nonce) answers how many it moved and moves nothing
        more; calling it again moves what matches then (usually nothing)."""
        chosen: tuple[str, ...] | None = None
        if ids is not None:
            if isinstance(ids, str):
                raise InvalidLeaseArgument("ids must be an iterable of signal ids, not a str")
            chosen = tuple(check_owner(i, "signal id") for i in ids)
            if not chosen:
                raise InvalidLeaseArgument("ids must name at least one signal (or be None)")
        return self._redrive(check_key(key), chosen)

    def dead_letter_keys(self, limit: int = 100) -> list[str]:
        """Keys that hold dead letters, from an index (never a scan of all keys); at most
        ``limit``, in no particular order."""
        return self._dead_letter_keys(check_limit(limit))

    def _check_signal(self, signal: object) -> str:
        if not isinstance(signal, Signal):
            raise InvalidLeaseArgument(f"signal must be a Signal, got {type(signal).__name__}")
        check_owner(signal.id, "signal.id")
        if isinstance(signal.enqueued_at_ms, bool) or not isinstance(signal.enqueued_at_ms, int):
            raise InvalidLeaseArgument("signal.enqueued_at_ms must be an int")
        if signal.enqueued_at_ms < 0:
            raise InvalidLeaseArgument("signal.enqueued_at_ms must not be negative")
        return encode_signal(signal, self.max_payload_bytes)

    # -- what a backend implements --------------------------------------------------------------

    @abstractmethod
    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult: ...

    @abstractmethod
    def _get_owner(self, key: str) -> str | None: ...

    @abstractmethod
    def _release(self, key: str, owner: str) -> None: ...

    @abstractmethod
    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool: ...

    @abstractmethod
    def _transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool: ...

    @abstractmethod
    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        """Raises :class:`~leaseguard.errors.QueueFull` for row Q8."""

    @abstractmethod
    def _take(
        self,
        key: str,
        owner: str,
        limit: int,
        token: int | None = None,
        completed: tuple[str, ...] = (),
    ) -> list[Signal]: ...

    @abstractmethod
    def _transfer_to_next(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        claim: bool,
        token: int | None = None,
        failure: Failure | None = None,
    ) -> Signal | None: ...

    @abstractmethod
    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None: ...

    @abstractmethod
    def _pending(self, key: str) -> int: ...

    @abstractmethod
    def _adopt(self, ttl_ms: int, limit: int, claim: bool) -> list[tuple[str, Signal]]: ...

    @abstractmethod
    def _inspect(self, key: str) -> KeyState: ...

    @abstractmethod
    def _redrive(self, key: str, ids: tuple[str, ...] | None) -> int: ...

    @abstractmethod
    def _dead_letter_keys(self, limit: int) -> list[str]: ...


def check_token(token: object) -> int | None:
    """The fencing token an owner-side call (``renew_lease``, ``take_signals``,
    ``transfer_to_next``) is limited to, or ``None`` for any grant held by ``owner``.

    An owner id alone does not name one grant: when an owner's lease expires with its signal in
    flight, that signal is delivered again and its id owns the key a second time, under a new
    token. The first, stale holder of that id (a paused process) must not renew, drain or hand
    off the new grant; passing the token it was granted makes those calls refuse it.
    """
    if token is None:
        return None
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= MAX_TOKEN:
        raise InvalidLeaseArgument(f"token must be None or an int in 0..{MAX_TOKEN}, got {token!r}")
    return token


def _check_bool(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidLeaseArgument(f"{what} must be a bool, got {type(value).__name__}")
    return value


MAX_REPORTED_IDS = 10_000
"""At most this many ids in one partial report (``completed`` and ``failed`` together)."""


def _check_partial(
    completed: object, failed: object, error: object
) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """The ids of a partial report (row G8), checked: lists or tuples of distinct signal ids,
    none in both, ``failed`` only with ``completed`` and ``error``."""
    if completed is None:
        if failed:
            raise InvalidLeaseArgument("transfer_to_next with failed= needs completed=")
        return None, ()
    ran = _check_ids("completed", completed)
    failing = _check_ids("failed", failed)
    if failing and error is None:
        raise InvalidLeaseArgument("transfer_to_next with failed= needs error=")
    if len(ran) + len(failing) > MAX_REPORTED_IDS:
        raise InvalidLeaseArgument(f"a partial report names at most {MAX_REPORTED_IDS} ids")
    both = set(ran) & set(failing)
    if both:
        raise InvalidLeaseArgument(f"ids both completed and failed: {sorted(both)[:3]}")
    return ran, failing


def _check_ids(what: str, ids: object) -> tuple[str, ...]:
    if isinstance(ids, str) or not isinstance(ids, (list, tuple)):
        raise InvalidLeaseArgument(f"{what} must be a list or tuple of signal ids, got {ids!r}")
    checked = tuple(check_owner(sid, f"an id in {what}") for sid in ids)
    if len(set(checked)) != len(checked):
        raise InvalidLeaseArgument(f"{what} names an id twice")
    return checked
