"""Runs many concurrent guarded invocations across OS processes and logs what happened.

The pieces stand in for AWS Lambda, nothing else:

* **workers** are OS processes (threads with the in-memory backend), each a warm Lambda
  execution environment running one invocation at a time of a handler guarded by the real
  ``@lease_owned`` against the real backend;
* the **platform** (the coordinator) delivers events with bursty arrivals, retries an
  invocation whose worker died (Lambda's retry of async events), replaces dead workers, and
  runs the **sweeper** (``adopt_orphans`` on a timer);
* an async ``Invoke`` from a handoff becomes a new delivery to the worker pool.

Handlers sleep for the event's ``work_ms`` and log their runs to per-worker JSON-lines files
(:mod:`leaseguard.simulate.checker` reads them back). With ``kill_rate`` a handler SIGKILLs its
own process mid-work with that probability per event, a real crash at a random point.
"""

from __future__ import annotations

import contextvars
import json
import logging
import multiprocessing as mp
import os
import queue
import random
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from leaseguard.config import ProviderConfig
from leaseguard.guard import lease_owned
from leaseguard.handoff import Envelope
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.renewal import current_lease
from leaseguard.testing.context import LambdaContext

Record = dict[str, Any]
MAX_ERROR_RETRIES = 3  # like Lambda's async retries: a delivery that keeps failing is dropped
_INVOCATION: contextvars.ContextVar[str] = contextvars.ContextVar("simulated_invocation")


@dataclass(frozen=True)
class SimulationConfig:
    provider: ProviderConfig
    workers: int = 4
    invocations: int = 400
    keys: int = 6
    work_ms: tuple[int, int] = (5, 40)
    ttl_ms: int = 1_000
    kill_rate: float = 0.0
    drain: int = 2
    burst: int = 8
    gap_ms: int = 40
    lambda_timeout_ms: int = 1_500
    handoff_margin_ms: int = 1_000
    sweep_every_ms: int = 200
    threads: bool = False
    seed: int = 1
    quiesce_timeout_s: float = 120.0
    # Random kills are not poison: each run an event's owner dies in counts as a failed attempt
    # (docs/protocol.md, G5), and at the default 3 an unlucky event would be dead-lettered, not
    # handled. The checker's promise is "every event handled", so the bound is high here.
    max_attempts: int = 100

    def __post_init__(self) -> None:
        if self.workers < 1 or self.invocations < 1 or self.keys < 1:
            raise ValueError("workers, invocations and keys must be at least 1")
        low, high = self.work_ms
        if not 0 <= low <= high:
            raise ValueError("work_ms must be (min, max) with 0 <= min <= max")
        if not 0.0 <= self.kill_rate < 1.0:
            raise ValueError("kill_rate must be in [0, 1)")
        if self.threads and self.kill_rate:
            raise ValueError("kill_rate needs worker processes; threads cannot be SIGKILLed")
        if self.provider.backend == "memory" and not self.threads:
            raise ValueError("the memory backend lives in one process: use threads")


@dataclass(frozen=True)
class Delivery:
    """One delivery of an invocation to a worker. ``attempt`` counts platform retries."""

    index: int
    kind: str  # event | handoff (an async Invoke by a handler) | sweep (sent by the sweeper)
    body: dict[str, Any]
    attempt: int = 0

    @property
    def invocation(self) -> str:
        return f"i{self.index}/{self.attempt}"


@dataclass
class SimulationResult:
    config: SimulationConfig
    records: list[Record]
    events: list[dict[str, Any]]
    started_ns: int
    finished_ns: int
    quiesced: bool
    stuck: dict[str, Any] = field(default_factory=dict)
    adopted: int = 0
    kills: int = 0

    @property
    def wall_s(self) -> float:
        return (self.finished_ns - self.started_ns) / 1e9


def plan_events(config: SimulationConfig) -> list[tuple[float, dict[str, Any]]]:
    """(arrival offset in seconds, event) pairs: bursts of events that favour a few hot keys,
    separated by random gaps."""
    rng = random.Random(config.seed)
    planned: list[tuple[float, dict[str, Any]]] = []
    clock = 0.0
    while len(planned) < config.invocations:
        size = min(
            1 + int(rng.expovariate(1 / max(config.burst - 1, 1))),
            config.invocations - len(planned),
        )
        for _ in range(size):
            key = min(int(rng.expovariate(3 / config.keys)), config.keys - 1)
            n = len(planned)
            planned.append(
                (
                    clock + rng.random() * 0.002,
                    {
                        "id": f"e{n:05d}",
                        "key": f"key-{key}",
                        "work_ms": rng.randint(*config.work_ms),
                    },
                )
            )
        clock += rng.random() * 2 * config.gap_ms / 1000
    return planned


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
            self._file.write(line + "\n")

    def close(self) -> None:
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

    @lease_owned(
        lambda e: e["key"],
        provider=provider,
        ttl_ms=config.ttl_ms,
        handoff_margin_ms=config.handoff_margin_ms,
        lambda_client=invoker,
        logger=logger,
        max_attempts=config.max_attempts,
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
                "owner": lease.owner,
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
        recorder.write({"type": "end", "run": run, "t": time.monotonic_ns(), "lost": lease.lost})
        return {"ran": event["id"]}

    return handler


def _status(result: Any) -> tuple[str, int | None]:
    if isinstance(result, dict) and isinstance(result.get("leaseguard"), dict):
        body = result["leaseguard"]
        return str(body.get("status")), body.get("position")
    return "ran", None


def _worker_loop(
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
    logger.addHandler(_RecordingLogHandler(recorder))
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
        recorder.close()


def _process_main(
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
    _worker_loop(worker, config, config.provider.build(), log_dir, inbox, outbox, current)


class Simulation:
    """Coordinator: delivers the plan, retries crashed invocations, sweeps, waits for quiet."""

    def __init__(
        self,
        config: SimulationConfig,
        progress: Callable[[int, int], None] | None = None,
        provider: BaseLeaseProvider | None = None,
    ) -> None:
        """``provider`` replaces the one ``config.provider`` describes; with threads it is the
        one every worker shares (how the tests run the checker against broken providers)."""
        if provider is not None and not config.threads:
            raise ValueError("a provider object can only be shared by threads")
        self.config = config
        self.progress = progress or (lambda done, total: None)
        self.provider = provider if provider is not None else config.provider.build()
        self.deliveries: dict[int, Delivery] = {}
        self.outstanding: set[int] = set()
        self.adopted = 0
        self.kills: list[Record] = []
        self.dropped: list[Record] = []
        self._lock = threading.Lock()
        self._done_events = 0

    # -- delivery -----------------------------------------------------------------------------

    def _deliver(self, kind: str, body: dict[str, Any], attempt: int = 0, index: int = -1) -> None:
        with self._lock:
            if index < 0:
                index = len(self.deliveries)
            delivery = Delivery(index, kind, body, attempt)
            self.deliveries[index] = delivery
            self.outstanding.add(index)
        self.inbox.put(delivery)

    def run(self) -> SimulationResult:
        config = self.config
        planned = plan_events(config)
        self.total = len(planned)
        log_dir = tempfile.mkdtemp(prefix="leaseguard-sim-")
        # forkserver, not fork: the coordinator has threads (feeder, sweeper) whose locks a
        # forked child could inherit mid-acquire.
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["leaseguard.simulate.engine"])
        if config.threads:
            self.inbox: Any = queue.Queue()
            self.outbox: Any = queue.Queue()
            self.current: Any = [-1] * config.workers
        else:
            self.inbox = context.Queue()
            self.outbox = context.Queue()
            self.current = context.Array("i", [-1] * config.workers)
        workers: list[Any] = [self._spawn(w, log_dir, context) for w in range(config.workers)]
        started = time.monotonic_ns()
        stop = threading.Event()
        feeder = threading.Thread(target=self._feed, args=(planned, stop), daemon=True)
        sweeper = threading.Thread(target=self._sweep, args=(stop,), daemon=True)
        feeder.start()
        sweeper.start()
        quiesced = self._wait(workers, log_dir, context, feeder)
        stop.set()
        feeder.join()
        sweeper.join()
        for _ in workers:
            self.inbox.put(None)
        for proc in workers:
            proc.join(10)
        finished = time.monotonic_ns()
        records = self._read(log_dir) + self.kills + self.dropped
        stuck = {} if quiesced else self._stuck_keys()
        return SimulationResult(
            config,
            records,
            [e for _, e in planned],
            started,
            finished,
            quiesced,
            stuck,
            self.adopted,
            len(self.kills),
        )

    def _spawn(self, worker: int, log_dir: str, context: Any) -> Any:
        if self.config.threads:
            thread = threading.Thread(
                target=_worker_loop,
                args=(
                    worker,
                    self.config,
                    self.provider,
                    log_dir,
                    self.inbox,
                    self.outbox,
                    self.current,
                ),
                daemon=True,
            )
            thread.start()
            return thread
        proc = context.Process(
            target=_process_main,
            args=(
                worker,
                self.config,
                log_dir,
                self.inbox,
                self.outbox,
                self.current,
                dict(os.environ),
            ),
            daemon=True,
        )
        proc.start()
        return proc

    def _feed(self, planned: list[tuple[float, dict[str, Any]]], stop: threading.Event) -> None:
        start = time.monotonic()
        for offset, event in planned:
            delay = start + offset - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            self._deliver("event", event)

    def _sweep(self, stop: threading.Event) -> None:
        while not stop.wait(self.config.sweep_every_ms / 1000):
            try:
                adopted = self.provider.adopt_orphans(self.config.ttl_ms, 100)
            except Exception:
                logging.getLogger("leaseguard.simulate").exception("sweeper pass failed")
                continue
            for key, signal_ in adopted:
                self.adopted += 1
                envelope = Envelope(key, signal_.id, signal_.token or 0, signal_.payload)
                self._deliver("sweep", envelope.to_event())

    def _drain_outbox(self) -> None:
        # Bounded, so a busy pool cannot starve the check for dead workers.
        for n in range(256):
            try:
                message = self.outbox.get(timeout=0.02) if n == 0 else self.outbox.get_nowait()
            except queue.Empty:
                return
            if message[0] == "submit":
                self._deliver(message[1], message[2])
            elif message[0] == "done":
                with self._lock:
                    self.outstanding.discard(message[1])
                    delivery = self.deliveries[message[1]]
                if message[2] == "error" and delivery.attempt < MAX_ERROR_RETRIES:
                    self._deliver(
                        delivery.kind, delivery.body, delivery.attempt + 1, delivery.index
                    )
                elif message[2] == "error":
                    self.dropped.append(
                        {
                            "type": "dropped",
                            "inv": delivery.invocation,
                            "kind": delivery.kind,
                            "event": delivery.body.get("id"),
                            "t": time.monotonic_ns(),
                        }
                    )
                elif delivery.kind == "event" and delivery.attempt == 0:
                    self._done_events += 1
                    self.progress(self._done_events, self.total)

    def _replace_dead(self, workers: list[Any], log_dir: str, context: Any) -> None:
        for worker, proc in enumerate(workers):
            if self.config.threads or proc.is_alive():
                continue
            index = self.current[worker]
            self.current[worker] = -1
            proc.join()
            workers[worker] = self._spawn(worker, log_dir, context)
            if index >= 0:
                delivery = self.deliveries[index]
                self.kills.append(
                    {
                        "type": "kill",
                        "worker": worker,
                        "inv": delivery.invocation,
                        "kind": delivery.kind,
                        "event": delivery.body.get("id"),
                        "t": time.monotonic_ns(),
                    }
                )
                with self._lock:
                    self.outstanding.discard(index)
                if delivery.kind == "event" and delivery.attempt == 0:
                    self._done_events += 1
                    self.progress(self._done_events, self.total)
                # Lambda retries an async invocation whose environment crashed.
                self._deliver(delivery.kind, delivery.body, delivery.attempt + 1, delivery.index)

    def _wait(self, workers: list[Any], log_dir: str, context: Any, feeder: Any) -> bool:
        deadline = time.monotonic() + self.config.quiesce_timeout_s
        keys = [f"key-{k}" for k in range(self.config.keys)]
        while time.monotonic() < deadline:
            self._drain_outbox()
            self._replace_dead(workers, log_dir, context)
            with self._lock:
                busy = bool(self.outstanding)
            if feeder.is_alive() or busy:
                continue
            if all(self._idle(key) for key in keys):
                self._drain_outbox()
                with self._lock:
                    if not self.outstanding:
                        return True
            time.sleep(0.05)
        return False

    def _idle(self, key: str) -> bool:
        state = self.provider.inspect_key(key)
        return state.owner is None and not state.queued and not state.in_flight

    def _stuck_keys(self) -> dict[str, Any]:
        stuck: dict[str, Any] = {}
        for k in range(self.config.keys):
            state = self.provider.inspect_key(f"key-{k}")
            if state.owner or state.queued or state.in_flight:
                stuck[state.key] = {
                    "owner": state.owner,
                    "queued": len(state.queued),
                    "in_flight": list(state.in_flight),
                }
        return stuck

    @staticmethod
    def _read(log_dir: str) -> list[Record]:
        records: list[Record] = []
        for path in sorted(Path(log_dir).glob("worker-*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue  # the last line of a killed worker may be cut short
        return records
