"""Failed runs: counted, logged, reported to the user's callback, copied to a dead-letter queue.

The backend decides a failed signal's fate when the owner hands off (docs/protocol.md, row G6):
back to the head of the queue with one more attempt, or dead-lettered on the key at
``max_attempts``. This module only tells people about it.
"""

from __future__ import annotations

import json
import logging

from leaseguard import aws
from leaseguard.observability import Telemetry
from leaseguard.types import Signal, now_ms

from .options import GuardOptions

_log = logging.getLogger("leaseguard")


class UnfinishedRuns(Exception):
    """The error a signal is dead-lettered with when it reached ``max_attempts`` through runs
    that never finished (its owners' leases ran out: a crash, a timeout, a lost lease)."""


class FailureReporter:
    def __init__(self, options: GuardOptions, telemetry: Telemetry) -> None:
        self.options = options
        self.telemetry = telemetry

    def signal_failed(
        self, key: str, signal: Signal, error: BaseException, *, reported: bool
    ) -> bool:
        """``reported``: the failure goes to the backend with the hand-off (not when the lease
        was lost first: then the signal is simply delivered again after the lease expires).
        True when the report dead-letters it."""
        dead = reported and signal.attempts + 1 >= self.options.max_attempts
        self.telemetry.count("SignalDeadLettered" if dead else "SignalFailed")
        if not reported:
            fate = "the lease was lost: it is delivered again once the lease expires"
        elif dead:
            fate = "dead-lettered"
        else:
            fate = "it goes back to the head of the queue"
        self.telemetry.log(
            logging.ERROR,
            f"handler failed on a signal; {fate}",
            lease_key=key,
            signal_id=signal.id,
            attempts=signal.attempts + 1,
            error=describe(error),
        )
        callback = self.options.on_signal_error
        if callback is not None:
            try:
                callback(signal, error)
            except Exception:
                _log.exception("on_signal_error callback failed")
        return dead

    def send_dead_letters(self, key: str, dead: list[Signal], error: BaseException) -> None:
        """Copies of what was just dead-lettered on the key, to ``dead_letter_queue_url``. The
        key keeps every dead letter either way, so a failed send loses nothing."""
        url = self.options.dead_letter_queue_url
        if not url:
            return
        for signal in dead:
            body = {
                "leaseguard": "dead-letter",
                "key": key,
                "id": signal.id,
                "attempts": signal.attempts + 1,
                "error": describe(error),
                "enqueued_at_ms": signal.enqueued_at_ms,
                "failed_at_ms": now_ms(),
                "payload": signal.payload,
            }
            try:
                client = self.options.sqs_client or aws.default_client("sqs")
                client.send_message(QueueUrl=url, MessageBody=json.dumps(body))
            except Exception as exc:
                self.telemetry.count("DeadLetterSendFailed")
                self.telemetry.log(
                    logging.ERROR,
                    "could not copy a dead letter to dead_letter_queue_url; it stays on the key",
                    lease_key=key,
                    signal_id=signal.id,
                    error=str(exc),
                )


def describe(error: BaseException) -> str:
    """How a failure is stored with the signal and shown to operators."""
    return f"{type(error).__name__}: {error}"
