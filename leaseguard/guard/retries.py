"""How long a failed signal waits before it runs again (``RetryConfig.delay_ms``), and how it waits
with no Lambda held idle.

A forwarded signal whose run failed goes back to the head of its key's queue (row G6), so the
hand-off that follows grants it the lease again. With a retry delay, that grant is made
unclaimed (row N3), so that nobody's run of it has started, and it waits in one of two ways:

* by SQS (``queue_url`` set, a standard queue): the envelope is sent with ``DelaySeconds``,
  and the grant lives the delay plus the TTL, so the receiver claims it when the delay is over;
* otherwise (an ``Invoke`` hand-off, inline only, a FIFO queue, which has no per-message
  delay): no envelope at all, and the grant's TTL *is* the delay. When it runs out the key is
  orphaned with the signal at the head, and the key's next event (row Q6) or the sweeper's
  next pass (row D) runs it: at the delay at the earliest, at the next arrival or sweeper pass
  at the latest.

Either way the grant holds the key, so events that arrive meanwhile queue behind the retry and
the key's order is kept, and an unclaimed grant that runs out charges no attempt (row G5), so
a delay never counts as a failed run. No step of the protocol changes: the delay is the TTL of
an N3 grant and the time its envelope is sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leaseguard.handoff import DelayedDispatcher, Envelope
from leaseguard.observability import Telemetry
from leaseguard.types import Signal

if TYPE_CHECKING:
    from .flow import Invocation

# The longest delay SQS gives a message (DelaySeconds), and so the longest a retry waits.
MAX_RETRY_DELAY_MS = 900_000
DEFAULT_RETRY_MAX_DELAY_MS = 300_000


def retry_delay_ms(base_ms: int, max_ms: int, key: str, signal_id: str, attempts: int) -> int:
    """The wait before run ``attempts + 1`` of ``signal_id`` (``attempts`` failed so far):
    ``base_ms`` doubled per earlier failure, capped at ``max_ms``, times a jitter in [0.5, 1).

    The jitter comes from a hash of the key, the id and the count rather than a random draw:
    retries of different signals still spread out, and the same retry always waits the same
    (a replay of the flow by the model checker, a resent hand-off)."""
    if base_ms <= 0 or attempts <= 0:
        return 0
    import zlib  # here: only a failure pays for it, not every cold start

    ceiling = min(max_ms, base_ms << min(attempts - 1, 40))
    spread = zlib.crc32(f"{key}\0{signal_id}\0{attempts}".encode()) / 2**32
    return max(1, int(ceiling * (0.5 + spread / 2)))


@dataclass(frozen=True)
class Retry:
    """How a failed signal's next run waits: ``delay_ms``, by ``later`` (an envelope sent to
    arrive then) or, without one, by its grant's TTL (``ttl_ms``) running out."""

    signal_id: str
    delay_ms: int
    later: DelayedDispatcher | None
    ttl_ms: int


def plan(
    invocation: Invocation,
    key: str,
    error: BaseException | None,
    failed: list[Signal],
    dead: list[Signal],
) -> Retry | None:
    """How the next run of the failed signal that goes back to the head waits, if the guard
    delays retries (``failed``: what the run's report fails, ``dead``: those it dead-letters);
    ``None`` to hand off as after a success."""
    options = invocation.options
    gone = {signal.id for signal in dead}
    back = [signal for signal in failed if signal.id not in gone]
    if error is None or not back or options.retry_delay_ms <= 0:
        return None
    head = back[0]  # G6: the failed ones go back to the head in in-flight order
    delay = retry_delay_ms(
        options.retry_delay_ms, options.retry_max_delay_ms, key, head.id, head.attempts + 1
    )
    later = invocation.guard.policy.delayed_dispatcher(invocation.context)
    return Retry(head.id, delay, later, delay + options.ttl_ms if later else delay)


def announce(telemetry: Telemetry, envelope: Envelope, retry: Retry) -> None:
    """Say that the retry's grant is left to its wait: an envelope sent to arrive after the
    delay (by ``retry.later``), or none (the grant runs out after the delay and the key is
    orphaned for its next event or the sweeper to run the signal)."""
    telemetry.count("RetryDelayed")
    telemetry.log(
        logging.INFO,
        "a failed signal waits before its next run",
        lease_key=envelope.key,
        signal_id=envelope.owner,
        retry_delay_ms=retry.delay_ms,
        wakes_by="sqs" if retry.later is not None else "its next event or the sweeper",
    )
