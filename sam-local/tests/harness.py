"""What the sam local suite runs the app against: a Redis and a moto server bound on the Docker
bridge's gateway (where the Lambda containers reach this machine), a gate in front of moto, and
``sam local start-api`` / ``start-lambda``. Everything here is started by this process and
stopped by process id.

The gate is an HTTP proxy between the functions and moto. It passes every request through,
except a thread worker's append to the conversations table that carries a message the test
named: that one it holds until the test lets it go (so an owner stays in its handler while the
test sends more messages, or runs into its deadline), answers with a DynamoDB error (a handler
that raises), or drops (the owner's container is killed while it waits). It also records which
container (its address on the bridge) sent the held append.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
CONVERSATIONS = "conversations"
LEASES = "leaseguard-leases"
WORKER = "ThreadWorkerFunction"
BATCH_WORKER = "BatchWorkerFunction"
SWEEPER = "SweeperFunction"
# Short, so a killed owner's lease runs out within seconds; the renewer renews every TTL/3.
LEASE_TTL_MS = 4000
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "sam-local", "AWS_SECRET_ACCESS_KEY": "sam-local"}
HOLD_LIMIT_S = 120.0
# Set by this proxy itself, not copied from moto's reply.
_HOP_HEADERS = ("content-length", "connection", "transfer-encoding", "server", "date")


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within 90 s")


class Process:
    """A child in its own process group, its output in ``log``; stopped by its pid."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("wb") as sink:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=ROOT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        # SIGINT, as Ctrl-C: sam local removes the containers it started on the way out.
        for sig, wait_s in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Hold:
    """One append the gate is holding: ``arrived`` once it came, from container ``peer``."""

    marker: str
    arrived: threading.Event = field(default_factory=threading.Event)
    decided: threading.Event = field(default_factory=threading.Event)
    forward: bool = True
    peer: str | None = None

    def release(self) -> None:
        self.forward = True
        self.decided.set()

    def drop(self) -> None:
        self.forward = False
        self.decided.set()

    def wait_arrived(self, timeout_s: float = 90) -> str:
        if not self.arrived.wait(timeout_s):
            raise AssertionError(f"no append of {self.marker!r} reached the gate in {timeout_s} s")
        assert self.peer is not None
        return self.peer


class Gate:
    """The proxy in front of moto (see the module docstring)."""

    def __init__(self, host: str, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.holds: dict[str, Hold] = {}
        self.failing: set[str] = set()
        self.lock = threading.Lock()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                action = gate.action(self.headers.get("X-Amz-Target", ""), body)
                if isinstance(action, Hold):
                    action.peer = self.client_address[0]
                    action.arrived.set()
                    action.decided.wait(HOLD_LIMIT_S)
                    if not action.forward:
                        self.close_connection = True
                        return
                elif action == "fail":
                    reply = json.dumps(
                        {
                            "__type": "com.amazon.coral.validate#ValidationException",
                            "message": "sam-local gate: this append fails on purpose",
                        }
                    ).encode()
                    self.send_response(400)
                    self.send_header("Content-Type", "application/x-amz-json-1.0")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                    return
                upstream = http.client.HTTPConnection(*gate.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    upstream.request("POST", self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                finally:
                    upstream.close()
                self.send_response(response.status)
                for name, value in response.getheaders():
                    if name.lower() not in _HOP_HEADERS:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def action(self, target: str, body: bytes) -> Hold | str | None:
        if not target.endswith(".UpdateItem"):
            return None
        try:
            table = json.loads(body).get("TableName")
        except ValueError:
            return None
        if table != CONVERSATIONS:
            return None
        text = body.decode(errors="replace")
        with self.lock:
            for marker in self.failing:
                if marker in text:
                    return "fail"
            for marker, hold in list(self.holds.items()):
                if marker in text:
                    del self.holds[marker]  # once: a rerun of the message passes
                    return hold
        return None

    def hold(self, marker: str) -> Hold:
        hold = Hold(marker)
        with self.lock:
            self.holds[marker] = hold
        return hold

    @contextmanager
    def failing_appends(self, marker: str) -> Iterator[None]:
        with self.lock:
            self.failing.add(marker)
        try:
            yield
        finally:
            with self.lock:
                self.failing.discard(marker)

    def close(self) -> None:
        with self.lock:
            for hold in self.holds.values():
                hold.drop()
        self.server.shutdown()
        self.server.server_close()


REPORT = re.compile(
    r"REPORT RequestId: (\S+)\s+(?:Init Duration: ([\d.]+) ms\s+)?Duration: ([\d.]+)"
)


def reports(log_text: str) -> list[tuple[str, float | None, float]]:
    """The emulator's REPORT lines: (request id, init duration ms or None, duration ms)."""
    return [
        (rid, float(init) if init else None, float(duration))
        for rid, init, duration in REPORT.findall(log_text)
    ]
