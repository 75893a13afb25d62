"""The worker side of the simulator: one warm Lambda execution environment (an OS process, or
a thread with the in-memory backend) running one invocation at a time of a handler guarded by
the real ``@lease_owned`` against the real backend.

Handlers sleep for the event's ``work_ms`` and log their runs to per-worker JSON-lines files
(:mod:`leaseguard.simulate.checker` reads them back). With ``kill_rate`` a handler SIGKILLs its
own process mid-work with that probability per event, a real crash at a random point.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from leaseguard import HandoffConfig, RetryConfig
from leaseguard.guard import lease_owned
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.renewal import LeaseHandle, current_lease
from leaseguard.testing.context import LambdaContext

from .config import Delivery, Record, SimulationConfig

_INVOCATION: contextvars.ContextVar[str] = contextvars.ContextVar("simulated_invocation")


class _FileRecorder:
    """Appends JSON lines to this worker's own file; flushes every line so a SIGKILL loses
    nothing that was written before it."""

    def __init__(self, path: Path, worker: int) -> None:
        self.worker = worker
        self.pid = os.getpid()
        self._file: TextIO = path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def write(self, record: Record) -> None:
        record.setdefault("worker", self.worker)
        record.setdefault("pid", self.pid)
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            # A renewer thread can outlive the run it served (a renewal still in flight when
            # the simulation ended): what it reports then comes after the log was read.
            if not self._file.closed:
                self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


class _RecordingLogHandler(logging.Handler):
    def __init__(self, recorder: _FileRecorder) -> None:
        super().__init__(logging.WARNING)
        self.recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        self.recorder.write(
            {
                "type": "log",
                "level": record.levelname,
                "message": record.getMessage(),
                "t": time.monotonic_ns(),
            }
        )


class _PoolInvoker:
    """Stands in for the Lambda ``Invoke`` API: an async invoke becomes a new delivery."""

    def __init__(self, submit: Callable[[str, dict[str, Any]], None]) -> None:
        self.submit = submit

    def invoke(self, FunctionName: str, InvocationType: str, Payload: bytes) -> dict[str, Any]:
        self.submit("handoff", json.loads(Payload))
        return {"StatusCode": 202}


def _make_handler(
    provider: BaseLeaseProvider,
    config: SimulationConfig,
    recorder: _FileRecorder,
    invoker: _PoolInvoker,
    rng: random.Random,
    logger: logging.Logger,
) -> Callable[[dict[str, Any], Any], Any]:
    def work(event: dict[str, Any], run: str) -> None:
        recorder.write(
            {
                "type": "begin",
                "event": event["id"],
                "key": event["key"],
                "run": run,
                "t": time.monotonic_ns(),
                "inv": _INVOCATION.get(),
            }
        )
        t0 = time.monotonic_ns()
        duration = event["work_ms"] / 1000
        if config.kill_rate and rng.random() < config.kill_rate:
            time.sleep(duration * rng.random())
            os.kill(os.getpid(), signal.SIGKILL)  # a crash in the middle of the handler
        time.sleep(duration)
        recorder.write(
            {
                "type": "handled",
                "event": event["id"],
                "key": event["key"],
                "run": run,
                "t0": t0,
                "t1": time.monotonic_ns(),
                "inv": _INVOCATION.get(),
            }
        )

    def lost(handle: LeaseHandle) -> None:
        # When a grant is found lost (by a renewal, at the end of its run, or at its hand-off)
        # and until when it was certainly held: the checker tells a lapse from a double grant.
        recorder.write(
            {
                "type": "lost",
                "key": handle.key,
                "owner": handle.owner,
                "token": handle.token,
                "t": time.monotonic_ns(),
                "valid_until": int(handle._valid_until * 1e9),
                "inv": _INVOCATION.get(None),  # None in the renewer's thread
            }
        )

    @lease_owned(
        lambda e: e["key"],
        provider=provider,
        ttl_ms=config.ttl_ms,
        logger=logger,
        on_lost=lost,
        handoff=HandoffConfig(
            margin_ms=config.handoff_margin_ms,
            lambda_client=invoker,
            drain_batch=config.drain_batch,
        ),
        retries=RetryConfig(max_attempts=config.max_attempts),
    )
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        lease = current_lease()
        run = uuid.uuid4().hex[:12]
        inv = _INVOCATION.get()
        recorder.write(
            {
                "type": "start",
                "run": run,
                "event": event["id"],
                "key": event["key"],
                "owner": lease.grant_owner,  # the grant (a batch item runs under its owner's)
                "token": lease.token,
                "t": time.monotonic_ns(),
                "inv": inv,
            }
        )
        work(event, run)
        if config.drain:
            taken = lease.take_signals(config.drain)
            if taken:
                recorder.write(
                    {
                        "type": "take",
                        "run": run,
                        "inv": inv,
                        "t": time.monotonic_ns(),
                        "events": [s.payload["id"] for s in taken],
                    }
                )
            for signal_ in taken:
                work(signal_.payload, run)
        recorder.write(
            {
                "type": "end",
                "run": run,
                "t": time.monotonic_ns(),
                "lost": lease.lost,
                "valid_until": int(lease._valid_until * 1e9),
            }
        )
        return {"ran": event["id"]}

    return handler


def _status(result: Any) -> tuple[str, int | None]:
    if isinstance(result, dict) and isinstance(result.get("leaseguard"), dict):
        body = result["leaseguard"]
        return str(body.get("status")), body.get("position")
    return "ran", None


def worker_loop(
    worker: int,
    config: SimulationConfig,
    provider: BaseLeaseProvider,
    log_dir: str,
    inbox: Any,
    outbox: Any,
    current: Any,
) -> None:
    recorder = _FileRecorder(Path(log_dir) / f"worker-{worker}.jsonl", worker)
    logger = logging.getLogger(f"leaseguard.simulate.worker{worker}")
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    log_handler = _RecordingLogHandler(recorder)
    # removed when the loop ends: the logger is found by name by the next simulation in this
    # process, which must not write to this one's closed log
    logger.addHandler(log_handler)
    rng = random.Random(config.seed * 1000 + worker + os.getpid())
    invoker = _PoolInvoker(lambda kind, body: outbox.put(("submit", kind, body)))
    handler = _make_handler(provider, config, recorder, invoker, rng, logger)
    try:
        while True:
            delivery: Delivery | None = inbox.get()
            if delivery is None:
                return
            current[worker] = delivery.index
            token = _INVOCATION.set(delivery.invocation)
            request_id = delivery.body["id"] if delivery.kind == "event" else uuid.uuid4().hex
            context = LambdaContext(
                function_name="simulated",
                aws_request_id=request_id,
                timeout_ms=config.lambda_timeout_ms,
            )
            t0 = time.monotonic_ns()
            try:
                status, position = _status(handler(delivery.body, context))
            except Exception as exc:
                status, position = "error", None
                recorder.write(
                    {
                        "type": "log",
                        "level": "ERROR",
                        "t": time.monotonic_ns(),
                        "message": f"{type(exc).__name__}: {exc}",
                    }
                )
            finally:
                _INVOCATION.reset(token)
            event_id = delivery.body.get("id") if delivery.kind == "event" else None
            recorder.write(
                {
                    "type": "invoke",
                    "inv": delivery.invocation,
                    "kind": delivery.kind,
                    "attempt": delivery.attempt,
                    "event": event_id,
                    "key": delivery.body.get("key"),
                    "t0": t0,
                    "t1": time.monotonic_ns(),
                    "status": status,
                    "position": position,
                }
            )
            current[worker] = -1
            outbox.put(("done", delivery.index, status))
    finally:
        logger.removeHandler(log_handler)
        recorder.close()


def process_main(
    worker: int,
    config: SimulationConfig,
    log_dir: str,
    inbox: Any,
    outbox: Any,
    current: Any,
    environ: dict[str, str],
) -> None:
    # The forkserver kept the environment it started with; credentials and endpoints must be
    # the coordinator's as of this run.
    os.environ.clear()
    os.environ.update(environ)
    worker_loop(worker, config, config.provider.build(), log_dir, inbox, outbox, current)
