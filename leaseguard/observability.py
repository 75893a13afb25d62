"""Logs, metrics and traces, through Powertools for AWS Lambda when it is installed.

* **Logs**: while a guarded handler runs, ``lease_key``, ``lease_owner`` and ``fencing_token``
  are appended to the Powertools ``Logger`` (yours if you pass ``logger=``, else the one for
  ``POWERTOOLS_SERVICE_NAME``), so every line the handler logs carries them. Without Powertools
  leaseguard logs to the standard ``logging`` logger ``"leaseguard"``.
* **Metrics** (Count / Milliseconds): ``LeaseAcquired``, ``LeaseForwarded``, ``LeaseHandedOff``,
  ``LeaseLost``, ``SignalFailed``, ``SignalDeadLettered``, ``SignalKeptHalted``, ``QueueFull``
  (a forward refused), ``QueueDepth`` (each forward's place in its key's queue),
  ``OldestQueuedAgeMs`` (how long a key's oldest queued event had waited when it was granted
  the key: at each hand-off, adoption and batch take, and for each key a sweeper pass
  adopts, with ``OrphanAdopted``), ``RetryDelayed`` (a failed event that waits its
  retry delay), ``LeaseWaitMs``, ``LeaseHoldMs``, and the rarer
  ``DuplicateDelivery``, ``HandoffDispatched``, ``HandoffFailed``, ``HandoffRejected``,
  ``DeadLetterSendFailed``. They go to the ``Metrics`` you pass, or, when
  ``POWERTOOLS_METRICS_NAMESPACE`` is set, to an ``EphemeralMetrics`` that leaseguard flushes at
  the end of each invocation (so it never mixes with your own metric set).
* **Traces**: with ``tracer=``, the lease key and token become X-Ray annotations.

Nothing here is required: without Powertools every call is a cheap no-op or a stdlib log line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from leaseguard.types import now_ms

if TYPE_CHECKING:
    from leaseguard.types import Signal

_std_log = logging.getLogger("leaseguard")
LEASE_LOG_KEYS = ("lease_key", "lease_owner", "fencing_token")


def powertools_available() -> bool:
    try:
        import aws_lambda_powertools  # noqa: F401
    except ImportError:
        return False
    return True


class Telemetry:
    """The guard's one way to log, count and annotate."""

    def __init__(self, logger: Any = None, metrics: Any = None, tracer: Any = None) -> None:
        self.logger = logger if logger is not None else _default_logger()
        self.metrics = metrics
        self._own_metrics = False
        if metrics is None and os.environ.get("POWERTOOLS_METRICS_NAMESPACE"):
            self.metrics = _ephemeral_metrics()
            self._own_metrics = self.metrics is not None
        self.tracer = tracer

    # -- logs -------------------------------------------------------------------------------------

    def log(self, level: int, message: str, **fields: Any) -> None:
        enabled = getattr(self.logger, "isEnabledFor", None)
        if enabled is not None and not enabled(level):
            return  # a forward's DEBUG line, at INFO: nothing to format
        if hasattr(self.logger, "append_keys"):  # Powertools Logger takes structured extras
            self.logger.log(level, message, extra=fields)
        else:
            detail = " ".join(f"{k}={v!r}" for k, v in fields.items())
            self.logger.log(level, f"{message} {detail}".rstrip())

    @contextmanager
    def lease_context(self, key: str, owner: str, token: int | None) -> Iterator[None]:
        """Every log line inside carries the lease; the keys are removed afterwards so the next
        invocation in a warm environment does not inherit them."""
        keys = {"lease_key": key, "lease_owner": owner, "fencing_token": token}
        scoped = _append_keys(self.logger, keys)
        if self.tracer is not None:
            self.tracer.put_annotation(key="lease_key", value=key)
            if token is not None:
                self.tracer.put_annotation(key="fencing_token", value=str(token))
        try:
            yield
        finally:
            _remove_keys(self.logger, scoped)

    # -- metrics ----------------------------------------------------------------------------------

    def count(self, name: str, value: int = 1) -> None:
        self._metric(name, "Count", value)

    def timing(self, name: str, ms: float) -> None:
        self._metric(name, "Milliseconds", max(ms, 0.0))

    def queued_age(self, signal: Signal) -> None:
        """``OldestQueuedAgeMs``: how long ``signal``, the oldest of its key's queue, has waited
        since it was queued. Recorded whenever leaseguard grants a key to its queue's head (a
        hand-off, an adoption, a batch take, a sweeper pass), from the signal those steps
        return: no request of its own."""
        self.timing("OldestQueuedAgeMs", now_ms() - signal.enqueued_at_ms)

    def _metric(self, name: str, unit: str, value: float) -> None:
        if self.metrics is None:
            return
        try:
            self.metrics.add_metric(name=name, unit=unit, value=value)
        except Exception:  # metrics must never fail an invocation
            _std_log.exception("could not record metric %s", name)

    def flush(self) -> None:
        if self._own_metrics and self.metrics is not None:
            try:
                self.metrics.flush_metrics()
            except Exception:
                _std_log.exception("could not flush leaseguard metrics")


def _append_keys(logger: Any, keys: dict[str, Any]) -> bool | None:
    """Context-scoped keys where Powertools offers them (one thread's or task's lease never
    shows in another's lines), else the logger-wide ones. Returns which kind was used."""
    if not hasattr(logger, "append_keys"):
        return None
    try:
        logger.thread_safe_append_keys(**keys)
        return True
    except (AttributeError, NotImplementedError):
        logger.append_keys(**keys)
        return False


def _remove_keys(logger: Any, scoped: bool | None) -> None:
    if scoped is True:
        logger.thread_safe_remove_keys(list(LEASE_LOG_KEYS))
    elif scoped is False:
        logger.remove_keys(list(LEASE_LOG_KEYS))


def _default_logger() -> Any:
    if powertools_available():
        from aws_lambda_powertools import Logger

        return Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME") or "leaseguard")
    return _std_log


def _ephemeral_metrics() -> Any:
    if not powertools_available():
        return None
    from aws_lambda_powertools.metrics import EphemeralMetrics

    return EphemeralMetrics()
