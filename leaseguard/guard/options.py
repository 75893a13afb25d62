"""The decorator's settings, validated once when a handler is decorated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

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
class GuardOptions:
    """The settings of one ``@lease_owned`` (see :func:`~leaseguard.lease_owned` for each)."""

    ttl_ms: int
    renew_every_ms: int
    handoff: Handoff = "auto"
    handoff_margin_ms: int = DEFAULT_HANDOFF_MARGIN_MS
    # None: from the event (HTTP sources wait); True/False: every invocation's caller does/not
    caller_waits: bool | None = None
    queue_url: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_delay_ms: int = 0  # 0: a failed signal runs again at once (see .retries)
    retry_max_delay_ms: int = DEFAULT_RETRY_MAX_DELAY_MS
    max_queue: int | None = None  # None: the provider's own bound
    drain_batch: int = DEFAULT_DRAIN_BATCH  # 0: every signal gets a grant of its own
    on_poison: OnPoison = "skip"
    dead_letter_queue_url: str | None = None
    on_lost: Callable[[LeaseHandle], None] | None = None
    on_signal_error: Callable[[Signal, BaseException], None] | None = None
    signal_id_fn: Callable[[Any, Any], str] = signal_id
    lambda_client: Any = None
    sqs_client: Any = None

    @classmethod
    def build(
        cls,
        name: str,
        *,
        ttl_ms: int | None,
        renew_every_ms: int | None,
        handoff: str,
        handoff_margin_ms: int,
        caller_waits: bool | None = None,
        queue_url: str | None,
        max_attempts: int | None,
        max_queue: int | None,
        drain_batch: int | None = None,
        retry_delay_ms: int | None = None,
        retry_max_delay_ms: int | None = None,
        on_poison: str,
        dead_letter_queue_url: str | None,
        on_lost: Callable[[LeaseHandle], None] | None,
        on_signal_error: Callable[[Signal, BaseException], None] | None,
        signal_id_fn: Callable[[Any, Any], str] | None,
        lambda_client: Any,
        sqs_client: Any,
    ) -> GuardOptions:
        """The options of handler ``name``, or a :class:`ConfigurationError` naming it; unset
        values come from ``LEASEGUARD_TTL_MS``, ``LEASEGUARD_MAX_ATTEMPTS``,
        ``LEASEGUARD_DRAIN_BATCH``, ``LEASEGUARD_RETRY_DELAY_MS`` and
        ``LEASEGUARD_RETRY_MAX_DELAY_MS``."""
        try:
            ttl = check_ttl(
                ttl_ms if ttl_ms is not None else env_int("LEASEGUARD_TTL_MS", DEFAULT_TTL_MS)
            )
            every = renew_every_ms if renew_every_ms is not None else max(ttl // 3, 1)
            every = check_positive_int("renew_every_ms", every, ttl - 1)
            if handoff_margin_ms != 0:
                check_positive_int("handoff_margin_ms", handoff_margin_ms, 900_000)
            if max_attempts is None:
                max_attempts = env_int("LEASEGUARD_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)
            attempts = check_positive_int("max_attempts", max_attempts, 1000)
            if max_queue is not None:
                check_positive_int("max_queue", max_queue, MAX_QUEUE_LIMIT)
            if drain_batch is None:
                drain_batch = env_int("LEASEGUARD_DRAIN_BATCH", DEFAULT_DRAIN_BATCH)
            if drain_batch != 0:
                check_positive_int("drain_batch", drain_batch, MAX_DRAIN_BATCH)
            if retry_delay_ms is None:
                retry_delay_ms = env_int("LEASEGUARD_RETRY_DELAY_MS", 0)
            if retry_delay_ms != 0:
                check_positive_int("retry_delay_ms", retry_delay_ms, MAX_RETRY_DELAY_MS)
            if retry_max_delay_ms is None:
                retry_max_delay_ms = env_int(
                    "LEASEGUARD_RETRY_MAX_DELAY_MS", DEFAULT_RETRY_MAX_DELAY_MS
                )
            check_positive_int("retry_max_delay_ms", retry_max_delay_ms, MAX_RETRY_DELAY_MS)
        except InvalidLeaseArgument as exc:
            raise ConfigurationError(f"@lease_owned on {name}: {exc}") from exc
        if handoff not in HANDOFF_MODES:
            raise ConfigurationError(f"handoff must be one of {HANDOFF_MODES}, got {handoff!r}")
        if handoff == "sqs" and not queue_url:
            raise ConfigurationError('handoff="sqs" needs queue_url (the queue to hand off to)')
        if caller_waits is not None and not isinstance(caller_waits, bool):
            raise ConfigurationError(
                f"@lease_owned on {name}: caller_waits must be True, False or None, "
                f"got {caller_waits!r}"
            )
        if on_poison not in ON_POISON:
            raise ConfigurationError(f"on_poison must be one of {ON_POISON}, got {on_poison!r}")
        return cls(
            ttl_ms=ttl,
            renew_every_ms=every,
            handoff=cast(Handoff, handoff),
            handoff_margin_ms=handoff_margin_ms,
            caller_waits=caller_waits,
            queue_url=queue_url,
            max_attempts=attempts,
            retry_delay_ms=retry_delay_ms,
            retry_max_delay_ms=retry_max_delay_ms,
            max_queue=max_queue,
            drain_batch=drain_batch,
            on_poison=cast(OnPoison, on_poison),
            dead_letter_queue_url=dead_letter_queue_url,
            on_lost=on_lost,
            on_signal_error=on_signal_error,
            signal_id_fn=signal_id_fn or signal_id,
            lambda_client=lambda_client,
            sqs_client=sqs_client,
        )
