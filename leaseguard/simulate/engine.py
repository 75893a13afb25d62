"""Runs many concurrent guarded invocations across OS processes and logs what happened.

The pieces stand in for AWS Lambda, nothing else:

* **workers** are OS processes (threads with the in-memory backend), each a warm Lambda
  execution environment running one invocation at a time of a handler guarded by the real
  ``@lease_owned`` against the real backend (:mod:`leaseguard.simulate.worker`);
* the **platform** (the coordinator, :class:`Simulation`) delivers events with bursty arrivals,
  retries an invocation whose worker died (Lambda's retry of async events), replaces dead
  workers, and runs the **sweeper** (:func:`~leaseguard.handoff.dispatch_orphans` on a timer);
* an async ``Invoke`` from a handoff, and each signal the sweeper adopts, becomes a new
  delivery to the worker pool.

What a run is asked to do and what it reports live in :mod:`leaseguard.simulate.config`.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from leaseguard.handoff import Envelope, dispatch_orphans
from leaseguard.providers.base import BaseLeaseProvider

from .config import (
    MAX_ERROR_RETRIES,
    Delivery,
    Record,
    SimulationConfig,
    SimulationResult,
    plan_events,
)
from .worker import process_main, worker_loop

__all__ = ["Simulation", "SimulationConfig", "SimulationResult"]

# What the forkserver imports once, before it forks the workers: without it each worker imports
# its provider's client library again (about 0.15 s of CPU for redis, 0.35 s for boto3, per
# worker and per respawn after a kill). The forkserver skips a module that is not installed.
FORKSERVER_PRELOAD = [
    "leaseguard.simulate.engine",
    "leaseguard.providers.redis",
    "leaseguard.providers.dynamodb",
    "redis",
    "boto3",
]


class _Outbox:
    """The workers' messages to the coordinator (a submitted ``Invoke``, an invocation's end),
    written straight to a pipe before ``put`` returns.

    ``multiprocessing.Queue.put`` hands its message to a feeder thread and returns at once: a
    worker that SIGKILLs itself soon after (a simulated crash in its next invocation) can take
    the message down with it. A lost ``done`` left its invocation outstanding forever, so the
    run never settled though every key was idle; a lost ``submit`` would be an ``Invoke`` that
    Lambda had accepted and then dropped, which Lambda does not do."""

    def __init__(self, context: Any) -> None:
        self._reader, self._writer = context.Pipe(duplex=False)
        self._write_lock = context.Lock()  # several workers write; one coordinator reads

    def put(self, message: tuple[Any, ...]) -> None:
        with self._write_lock:
            self._writer.send(message)

    def get(self, timeout: float = 0.0) -> tuple[Any, ...]:
        if not self._reader.poll(timeout):
            raise queue.Empty
        message: tuple[Any, ...] = self._reader.recv()
        return message

    def get_nowait(self) -> tuple[Any, ...]:
        return self.get(0.0)


class _PoolDispatcher:
    """The sweeper's :class:`~leaseguard.handoff.Dispatcher`: an adopted signal's envelope
    becomes a delivery to the pool, as an async ``Invoke`` of it would on Lambda."""

    def __init__(self, deliver: Callable[[str, dict[str, Any]], None]) -> None:
        self.deliver = deliver
        self.adopted = 0

    def dispatch(self, envelope: Envelope) -> None:
        self.adopted += 1
        self.deliver("sweep", envelope.to_event())


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
        self.sweeps = _PoolDispatcher(self._deliver)
        self.kills: list[Record] = []
        self.dropped: list[Record] = []
        self._lock = threading.Lock()
        self._done_events = 0

    @property
    def adopted(self) -> int:
        """Signals the sweeper adopted and delivered so far."""
        return self.sweeps.adopted

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
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
        if config.threads:
            self.inbox: Any = queue.Queue()
            self.outbox: Any = queue.Queue()
            self.current: Any = [-1] * config.workers
        else:
            self.inbox = context.Queue()
            self.outbox = _Outbox(context)
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
        with self._lock:
            unfinished = sorted(self.deliveries[i].invocation for i in self.outstanding)
        return SimulationResult(
            config,
            records,
            [e for _, e in planned],
            started,
            finished,
            quiesced,
            stuck,
            unfinished,
            self.sweeps.adopted,
            len(self.kills),
        )

    def _spawn(self, worker: int, log_dir: str, context: Any) -> Any:
        if self.config.threads:
            thread = threading.Thread(
                target=worker_loop,
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
            target=process_main,
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
                dispatch_orphans(self.provider, self.sweeps, self.config.ttl_ms)
            except Exception:
                logging.getLogger("leaseguard.simulate").exception("sweeper pass failed")

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
