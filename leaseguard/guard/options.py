"""The decorator's settings: two typed groups a handler author may pass (:class:`HandoffConfig`,
:class:`RetryConfig`), each setting defined once, in its group, with its default and its
environment variable; and :class:`GuardOptions`, what one ``@lease_owned`` resolved them to,
validated once, when the handler is decorated."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from leaseguard.config import DEFAULT_TTL_MS, env_int
from leaseguard.errors import ConfigurationError, InvalidLeaseArgument
from leaseguard.events import signal_id
from leaseguard.protocol.model import DEFAULT_MAX_ATTEMPTS
from leaseguard.providers.base import MAX_QUEUE_LIMIT, ON_POISON, OnPoison
from leaseguard.validation import check_positive_int, check_ttl

from .retries import DEFAULT_RETRY_MAX_DELAY_MS, MAX_RETRY_DELAY_MS

if TYPE_CHECKING:
    from leaseguard.renewal import LeaseHandle
    from leaseguard.types import Signal

Handoff = Literal["auto", "inline", "invoke", "sqs"]
HANDOFF_MODES = ("auto", "inline", "invoke", "sqs")
DEFAULT_HANDOFF_MARGIN_MS = 3_000
DEFAULT_DRAIN_BATCH = 0
MAX_DRAIN_BATCH = 1_000


@dataclass(frozen=True)
class HandoffConfig:
    """How the next queued event runs when a run ends: ``@lease_owned(handoff=...)``.

    Parameters
    ----------
    mode : {"auto", "inline", "invoke", "sqs"}
        ``"auto"`` runs the next event inline while the Lambda deadline leaves ``margin_ms``
        more than the longest run so far, else hands it off by SQS (``queue_url``) or by an
        async ``Invoke`` of this function; the other modes force one way. A bare string as
        ``handoff=`` is this mode.
    margin_ms : int
        The deadline's margin for ``"auto"`` (default 3,000).
    queue_url : str, optional
        The SQS queue hand-offs go through (``mode="sqs"``; ``"auto"`` prefers it). On a
        standard queue a retry's wait is the message's delay (:class:`RetryConfig`).
    caller_waits : bool, optional
        Whose caller waits for the answer, so that ``"auto"`` runs nothing after its own event
        and hands the rest off: ``None`` (default) decides from the event (API Gateway, function
        URLs and ALB wait; SQS, async ``Invoke``, streams and envelopes do not); ``True`` for a
        function called with ``RequestResponse``, which looks async to it; ``False`` drains
        inline for every source.
    drain_batch : int, optional
        Default ``LEASEGUARD_DRAIN_BATCH`` or 0 (off: the events of a batch share one fencing
        token). An owner whose next event would run inline runs up to this many queued events
        one by one under its own grant, each taken with a report of the one before, then hands
        off once (docs/design.md).
    lambda_client, sqs_client
        boto3 clients for the hand-off's ``Invoke`` and ``SendMessage`` (default: built on
        first use).
    """

    mode: Handoff = "auto"
    margin_ms: int = DEFAULT_HANDOFF_MARGIN_MS
    queue_url: str | None = None
    caller_waits: bool | None = None
    drain_batch: int | None = None
    lambda_client: Any = field(default=None, compare=False, repr=False)
    sqs_client: Any = field(default=None, compare=False, repr=False)

    def resolved(self) -> HandoffConfig:
        """This group with its environment defaults applied, checked."""
        if self.mode not in HANDOFF_MODES:
            raise ConfigurationError(f"handoff must be one of {HANDOFF_MODES}, got {self.mode!r}")
        if self.mode == "sqs" and not self.queue_url:
            raise ConfigurationError('handoff="sqs" needs queue_url (the queue to hand off to)')
        if self.caller_waits is not None and not isinstance(self.caller_waits, bool):
            raise ConfigurationError(
                f"caller_waits must be True, False or None, got {self.caller_waits!r}"
            )
        if self.margin_ms != 0:
            check_positive_int("handoff margin_ms", self.margin_ms, 900_000)
        batch = self.drain_batch
        if batch is None:
            batch = env_int("LEASEGUARD_DRAIN_BATCH", DEFAULT_DRAIN_BATCH)
        if batch != 0:
            check_positive_int("drain_batch", batch, MAX_DRAIN_BATCH)
        return replace(self, drain_batch=batch)


@dataclass(frozen=True)
class RetryConfig:
    """What happens to a forwarded event whose run failed: ``@lease_owned(retries=...)``.

    A failed event goes back to the head of its key's queue with one more attempt (a run that
    never finished, a crash or a timeout, counts as failed). The invocation's own event
    re-raises instead, so its platform retries it (docs/safety.md, "Where a failure goes").

    Parameters
    ----------
    max_attempts : int, optional
        Default ``LEASEGUARD_MAX_ATTEMPTS`` or 3: failed runs after which the event is
        dead-lettered on its key (``leaseguard dead-letters``, ``inspect``, ``redrive``).
    delay_ms : int, optional
        Default ``LEASEGUARD_RETRY_DELAY_MS`` or 0 (at once): how long the event waits before
        its next run, doubled after each further failure, with jitter. No invocation waits: by
        SQS its envelope is delayed, otherwise the grant that holds the key for it runs out
        after the delay and the key's next event or the sweeper runs it. Events behind it wait
        their turn.
    max_delay_ms : int, optional
        Default ``LEASEGUARD_RETRY_MAX_DELAY_MS`` or 300,000 (at most 900,000, SQS's longest
        message delay): the longest wait.
    on_poison : {"skip", "halt"}
        After a dead letter, ``"skip"`` lets the key move on; ``"halt"`` keeps strict order:
        nothing queued behind it runs until it is redriven.
    dead_letter_queue_url : str, optional
        Also send each dead letter (key, id, payload, attempts, error) to this SQS queue, for
        example the DLQ your source queue's redrive policy names.
    """

    max_attempts: int | None = None
    delay_ms: int | None = None
    max_delay_ms: int | None = None
    on_poison: OnPoison = "skip"
    dead_letter_queue_url: str | None = None

    def resolved(self) -> RetryConfig:
        """This group with its environment defaults applied, checked."""
        if self.on_poison not in ON_POISON:
            raise ConfigurationError(
                f"on_poison must be one of {ON_POISON}, got {self.on_poison!r}"
            )
        attempts = self.max_attempts
        if attempts is None:
            attempts = env_int("LEASEGUARD_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)
        check_positive_int("max_attempts", attempts, 1000)
        delay = (
            self.delay_ms if self.delay_ms is not None else env_int("LEASEGUARD_RETRY_DELAY_MS", 0)
        )
        if delay != 0:
            check_positive_int("retry delay_ms", delay, MAX_RETRY_DELAY_MS)
        longest = self.max_delay_ms
        if longest is None:
            longest = env_int("LEASEGUARD_RETRY_MAX_DELAY_MS", DEFAULT_RETRY_MAX_DELAY_MS)
        check_positive_int("retry max_delay_ms", longest, MAX_RETRY_DELAY_MS)
        return replace(self, max_attempts=attempts, delay_ms=delay, max_delay_ms=longest)


# The decorator's keywords before the groups (0.1), and where each now lives: still accepted,
# with a DeprecationWarning.
LEGACY_KEYWORDS: Mapping[str, tuple[str, str]] = {
    "handoff_margin_ms": ("handoff", "margin_ms"),
    "queue_url": ("handoff", "queue_url"),
    "drain_batch": ("handoff", "drain_batch"),
    "lambda_client": ("handoff", "lambda_client"),
    "sqs_client": ("handoff", "sqs_client"),
    "max_attempts": ("retries", "max_attempts"),
    "on_poison": ("retries", "on_poison"),
    "dead_letter_queue_url": ("retries", "dead_letter_queue_url"),
}
_GROUP_CLASS = {"handoff": "HandoffConfig", "retries": "RetryConfig"}


def grouped(
    name: str,
    handoff: Handoff | HandoffConfig,
    retries: RetryConfig | None,
    legacy: Mapping[str, Any],
) -> tuple[HandoffConfig, RetryConfig]:
    """The two groups of handler ``name``, with the 0.1 keywords in ``legacy`` moved into
    them (each with a DeprecationWarning naming its new place); a keyword that is neither, or
    one given both ways, is an error."""
    handoff_group = handoff if isinstance(handoff, HandoffConfig) else HandoffConfig(handoff)
    retry_group = retries if retries is not None else RetryConfig()
    moved: dict[str, dict[str, Any]] = {"handoff": {}, "retries": {}}
    for keyword, value in legacy.items():
        if keyword not in LEGACY_KEYWORDS:
            raise TypeError(f"lease_owned() got an unexpected keyword argument {keyword!r}")
        group, attribute = LEGACY_KEYWORDS[keyword]
        warnings.warn(
            f"lease_owned({keyword}=...) is deprecated: pass "
            f"{group}={_GROUP_CLASS[group]}({attribute}=...)",
            DeprecationWarning,
            stacklevel=3,
        )
        moved[group][attribute] = value
    for group, config in (("handoff", handoff_group), ("retries", retry_group)):
        defaults = {f.name: f.default for f in fields(config)}
        clash = [a for a in moved[group] if getattr(config, a) != defaults[a]]
        if clash:
            raise ConfigurationError(
                f"@lease_owned on {name}: {', '.join(clash)} given both as a keyword and in "
                f"{group}={_GROUP_CLASS[group]}(...)"
            )
    return replace(handoff_group, **moved["handoff"]), replace(retry_group, **moved["retries"])


@dataclass(frozen=True)
class GuardOptions:
    """The settings of one ``@lease_owned``, resolved (see :func:`~leaseguard.lease_owned`)."""

    ttl_ms: int
    renew_every_ms: int
    handoff: HandoffConfig = HandoffConfig(drain_batch=DEFAULT_DRAIN_BATCH)
    retries: RetryConfig = RetryConfig(
        max_attempts=DEFAULT_MAX_ATTEMPTS, delay_ms=0, max_delay_ms=DEFAULT_RETRY_MAX_DELAY_MS
    )
    max_queue: int | None = None  # None: the provider's own bound
    on_lost: Callable[[LeaseHandle], None] | None = None
    on_signal_error: Callable[[Signal, BaseException], None] | None = None
    signal_id_fn: Callable[[Any, Any], str] = signal_id

    # The groups' numbers, typed as resolved (their fields are optional until then: None is
    # "from the environment").
    @property
    def max_attempts(self) -> int:
        return self.retries.max_attempts or DEFAULT_MAX_ATTEMPTS

    @property
    def retry_delay_ms(self) -> int:
        return self.retries.delay_ms or 0

    @property
    def retry_max_delay_ms(self) -> int:
        return self.retries.max_delay_ms or DEFAULT_RETRY_MAX_DELAY_MS

    @property
    def drain_batch(self) -> int:
        return self.handoff.drain_batch or 0

    @classmethod
    def build(
        cls,
        name: str,
        *,
        ttl_ms: int | None,
        renew_every_ms: int | None,
        handoff: HandoffConfig,
        retries: RetryConfig,
        max_queue: int | None,
        on_lost: Callable[[LeaseHandle], None] | None,
        on_signal_error: Callable[[Signal, BaseException], None] | None,
        signal_id_fn: Callable[[Any, Any], str] | None,
    ) -> GuardOptions:
        """The options of handler ``name``, or a :class:`ConfigurationError` naming it; unset
        values come from ``LEASEGUARD_TTL_MS`` and the groups' variables."""
        try:
            ttl = check_ttl(
                ttl_ms if ttl_ms is not None else env_int("LEASEGUARD_TTL_MS", DEFAULT_TTL_MS)
            )
            every = renew_every_ms if renew_every_ms is not None else max(ttl // 3, 1)
            every = check_positive_int("renew_every_ms", every, ttl - 1)
            if max_queue is not None:
                check_positive_int("max_queue", max_queue, MAX_QUEUE_LIMIT)
            handoff, retries = handoff.resolved(), retries.resolved()
        except (InvalidLeaseArgument, ConfigurationError) as exc:
            raise ConfigurationError(f"@lease_owned on {name}: {exc}") from exc
        return cls(
            ttl_ms=ttl,
            renew_every_ms=every,
            handoff=handoff,
            retries=retries,
            max_queue=max_queue,
            on_lost=on_lost,
            on_signal_error=on_signal_error,
            signal_id_fn=signal_id_fn or signal_id,
        )
