"""Failed runs: counted, logged, reported to the user's callback, copied to a dead-letter queue.

The backend decides a failed signal's fate when the owner hands off (docs/protocol.md, row G6):
back to the head of the queue with one more attempt, or dead-lettered on the key at
``max_attempts`` (or, the key's dead-letter list being full, kept at the head with the key
halted). This module only tells people about it.
"""

from __future__ import annotations

import json
import logging

from leaseguard import aws
from leaseguard.errors import LeaseguardError
from leaseguard.observability import Telemetry
from leaseguard.types import QueueProvider, Signal, now_ms

from .options import GuardOptions
from .responses import Status

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
        if not dead:  # a last attempt is counted once the report says where it went
            self.telemetry.count("SignalFailed")
        if not reported:
            fate = "the lease was lost: it is delivered again once the lease expires"
        elif dead:
            fate = "its last attempt: dead-lettered with the hand-off"
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

    def reported_dead(
        self, provider: QueueProvider, key: str, dead: list[Signal], error: BaseException
    ) -> set[str]:
        """After the hand-off that reported ``dead`` at their last attempt: those the key now
        holds as dead letters are counted (``SignalDeadLettered``) and copied to
        ``dead_letter_queue_url``; any the key kept at the head of its queue instead, its
        dead-letter list being full (docs/protocol.md, G6, invariant (n)), are counted
        ``SignalKeptHalted`` and said so: the key is halted until a redrive, and nothing went
        to the dead-letter queue. One read of the key, only on this rare path; when it fails
        (or a provider of another package has no ``inspect_key``) they are counted as
        dead-lettered (what the report asked for) and copied. The ids dead-lettered."""
        inspect = getattr(provider, "inspect_key", None)
        try:
            if inspect is None:
                raise LeaseguardError("the provider has no inspect_key")
            held = {letter.id for letter in inspect(key).dead_letters}
        except Exception as exc:  # a read for a report: the hand-off itself succeeded
            self.telemetry.log(
                logging.WARNING,
                "could not read which signals the key dead-lettered; counting all as such",
                lease_key=key,
                error=str(exc),
            )
            held = {signal.id for signal in dead}
        lettered = [signal for signal in dead if signal.id in held]
        for signal in dead:
            if signal.id in held:
                self.telemetry.count("SignalDeadLettered")
                continue
            self.telemetry.count("SignalKeptHalted")
            self.telemetry.log(
                logging.ERROR,
                "the key's dead-letter list is full: the signal at its last attempt is kept at"
                " the head of its queue and the key halted until a redrive",
                lease_key=key,
                signal_id=signal.id,
                attempts=signal.attempts + 1,
                error=describe(error),
            )
        self.send_dead_letters(key, lettered, error)
        return {signal.id for signal in lettered}

    def not_requeued(
        self, provider: QueueProvider, key: str, signal_id: str, holder: str | None
    ) -> Status:
        """Why a forward of ``signal_id`` was not queued again: :attr:`Status.DEAD_LETTERED`
        when it is one of the key's dead letters (a platform retry of an own event whose last
        attempt failed), else :attr:`Status.DUPLICATE` (running, or done). The backend's answer
        does not tell the two apart, so this reads the key, only on this rare path and not for
        a second delivery of the owner itself; a read that fails answers duplicate."""
        if holder == signal_id:
            return Status.DUPLICATE
        inspect = getattr(provider, "inspect_key", None)
        try:
            letters = inspect(key).dead_letters if inspect is not None else ()
        except Exception as exc:  # a read for the answer's wording: nothing depends on it
            self.telemetry.log(
                logging.WARNING,
                "could not read the key's dead letters; answering duplicate",
                lease_key=key,
                error=str(exc),
            )
            return Status.DUPLICATE
        if any(letter.id == signal_id for letter in letters):
            return Status.DEAD_LETTERED
        return Status.DUPLICATE

    def send_dead_letters(self, key: str, dead: list[Signal], error: BaseException) -> None:
        """Copies of what was just dead-lettered on the key, to ``dead_letter_queue_url``. The
        key keeps every dead letter either way, so a failed send loses nothing."""
        url = self.options.retries.dead_letter_queue_url
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
                client = self.options.handoff.sqs_client or aws.default_client("sqs")
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
