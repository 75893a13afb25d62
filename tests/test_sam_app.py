"""The SAM application's functions, end to end and in-process (there is no Docker here).

``functions/thread_worker/app.py`` and ``functions/sweeper/app.py`` are loaded from their files,
as Lambda loads them, into worker processes that stand in for warm execution environments, and
called with events shaped like API Gateway HTTP API requests and async invocations. They run on
moto's DynamoDB (behind one lock, so conditional writes are atomic as DynamoDB's are) and on a
real Redis, configured only through environment variables, as in the deployed stack.

The functions call AWS through plain boto3. ``AWS_ENDPOINT_URL_DYNAMODB`` points them at moto
and ``AWS_ENDPOINT_URL_LAMBDA`` at :class:`FakeLambda`, a small HTTP server that speaks the
Lambda ``Invoke`` API: an async invoke (a handoff, or a grant sent by the sweeper) becomes a
delivery to the worker pool. Nothing of leaseguard is mocked.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
import pytest

from leaseguard.config import ProviderConfig
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.testing import DynamoDBServer, LambdaContext, free_port

ROOT = Path(__file__).resolve().parent.parent
WORKER_PATH = ROOT / "functions" / "thread_worker" / "app.py"
SWEEPER_PATH = ROOT / "functions" / "sweeper" / "app.py"
EVENTS = ROOT / "events"
WORKER_NAME = "leaseguard-chat-thread-worker"
TTL_MS = 2_000
# An environment whose deadline leaves no room to run the next message inline (the margin is
# 3 s) hands every lease on by async Invoke; one with a long deadline hands off inline.
SHORT_TIMEOUT_MS = 3_000
LONG_TIMEOUT_MS = 60_000
QUIET_TIMEOUT_S = 90.0

FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


# -- the stand-ins for Lambda ----------------------------------------------------------------


class FakeLambda:
    """The Lambda ``Invoke`` API on 127.0.0.1: an ``Event`` invoke of the worker function is
    handed to ``deliver`` and answered 202, as Lambda queues an async invocation."""

    def __init__(self, deliver: Callable[[dict[str, Any]], None]) -> None:
        self.invocations: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                match = re.fullmatch(r"/2015-03-31/functions/([^/]+)/invocations", self.path)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                name = unquote(match.group(1)) if match else ""
                name = name.split(":function:")[-1].split(":")[0]
                if name != WORKER_NAME or self.headers.get("x-amz-invocation-type") != "Event":
                    self._reply(404, {"Type": "User", "message": f"no async target {name!r}"})
                    return
                event = json.loads(body)
                fake.invocations.append(event)
                deliver(event)
                self._reply(202, None)

            def _reply(self, status: int, body: Any) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                if status == 404:
                    self.send_header("x-amzn-errortype", "ResourceNotFoundException")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _load(path: Path, name: str) -> Any:
    """A function's module loaded from its file, as Lambda loads ``app.py`` (both are ``app``,
    so each gets its own module name here)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _HoldBeforeAppend:
    """Wraps the worker's conversation table in one process: writing the message ``hold``
    reports the lease, waits until the test says go, then goes on, or with ``kill`` SIGKILLs
    the process before the write."""

    def __init__(self, table: Any, outbox: Any, go: Any, kill: bool) -> None:
        self.table, self.outbox, self.go, self.kill = table, outbox, go, kill

    def update_item(self, **request: Any) -> Any:
        if request["ExpressionAttributeValues"][":m"][0]["text"] == "hold":
            from leaseguard import current_lease

            lease = current_lease()
            self.outbox.put(("owner", lease.owner, lease.token))
            self.go.wait(60)
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.table.update_item(**request)


def _environment_main(
    index: int,
    environ: dict[str, str],
    inbox: Any,
    async_inbox: Any,
    outbox: Any,
    hold: tuple[Any, bool] | None,
) -> None:
    """One warm execution environment: runs direct invocations from its own inbox in order
    (a client that waits for each answer) and async deliveries from the shared one."""
    os.environ.update(environ)
    worker = _load(WORKER_PATH, "thread_worker_app")
    sweeper = _load(SWEEPER_PATH, "sweeper_app")
    if hold is not None:
        worker.conversations = _HoldBeforeAppend(worker.conversations, outbox, *hold)
    while True:
        try:
            job = async_inbox.get_nowait() if hold is None else None
        except queue.Empty:
            job = None
        if job is None:
            try:
                job = inbox.get(timeout=0.02)
            except queue.Empty:
                continue
        if job == "stop":
            return
        job_id, function, event, timeout_ms = job
        handler = sweeper.handler if function == "sweeper" else worker.handler
        context = LambdaContext(
            function_name=WORKER_NAME if function == "worker" else "leaseguard-chat-sweeper",
            aws_request_id=str(uuid.uuid4()),
            timeout_ms=timeout_ms,
        )
        try:
            outbox.put(("done", job_id, index, "ok", handler(event, context)))
        except Exception as exc:
            outbox.put(("done", job_id, index, "error", f"{type(exc).__name__}: {exc}"))


@dataclass
class Pool:
    """Worker processes, the fake Lambda service, and the bookkeeping to know when all is quiet."""

    environ: dict[str, str]
    provider: BaseLeaseProvider
    table: Any
    context: Any = field(default_factory=lambda: mp.get_context("spawn"))

    def __post_init__(self) -> None:
        self.outbox = self.context.Queue()
        self.async_inbox = self.context.Queue()
        self.results: dict[str, tuple[int, str, Any]] = {}
        self.notes: list[tuple[Any, ...]] = []
        self.outstanding: set[str] = set()
        self._lock = threading.Lock()
        self.fake_lambda = FakeLambda(self._deliver_async)
        self.environ = {**self.environ, "AWS_ENDPOINT_URL_LAMBDA": self.fake_lambda.endpoint_url}
        self.processes: list[Any] = []
        self.inboxes: list[Any] = []

    def start(self, n: int) -> Pool:
        for _ in range(n):
            self.add()
        return self

    def add(self, hold: tuple[Any, bool] | None = None) -> int:
        """One more environment; with ``hold=(event, kill)`` it serves no async invokes and
        holds (or dies) before appending the message ``hold``."""
        index = len(self.processes)
        inbox = self.context.Queue()
        process = self.context.Process(
            target=_environment_main,
            args=(index, self.environ, inbox, self.async_inbox, self.outbox, hold),
            daemon=True,
        )
        process.start()
        self.processes.append(process)
        self.inboxes.append(inbox)
        return index

    def _deliver_async(self, event: dict[str, Any]) -> None:
        job_id = f"async-{uuid.uuid4().hex[:8]}"
        with self._lock:
            self.outstanding.add(job_id)
        self.async_inbox.put((job_id, "worker", event, SHORT_TIMEOUT_MS))

    def submit(self, index: int, function: str, event: Any, timeout_ms: int) -> str:
        job_id = f"{function}-{uuid.uuid4().hex[:8]}"
        with self._lock:
            self.outstanding.add(job_id)
        self.inboxes[index].put((job_id, function, event, timeout_ms))
        return job_id

    def pump(self, timeout_s: float = 0.05) -> None:
        try:
            message = self.outbox.get(timeout=timeout_s)
        except queue.Empty:
            return
        if message[0] == "done":
            _, job_id, index, status, value = message
            with self._lock:
                self.outstanding.discard(job_id)
            self.results[job_id] = (index, status, value)
        else:
            self.notes.append(message)

    def result(self, job_id: str, timeout_s: float = 60.0) -> tuple[int, str, Any]:
        deadline = time.monotonic() + timeout_s
        while job_id not in self.results:
            assert time.monotonic() < deadline, f"{job_id} did not finish"
            self.pump()
        return self.results[job_id]

    def note(self, timeout_s: float = 60.0) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout_s
        while not self.notes:
            assert time.monotonic() < deadline, "no note from a worker"
            self.pump()
        return self.notes.pop(0)

    def wait_quiet(self, key: str) -> None:
        """Until no invocation is running or queued and the key has no owner and nothing
        pending: then every message has been handled. A key left orphaned meanwhile (an
        owner's lease ran out on a loaded machine, so it handed nothing off) gets the
        sweeper's pass, as the deployed app's schedule would give it."""
        deadline = time.monotonic() + QUIET_TIMEOUT_S
        sweep_event = json.loads((EVENTS / "sweeper" / "schedule.json").read_text())
        while time.monotonic() < deadline:
            self.pump()
            with self._lock:
                busy = bool(self.outstanding)
            if busy:
                continue
            state = self.provider.inspect_key(key)
            if state.owner is None and not state.queued and not state.in_flight:
                return
            if state.owner is None:  # orphaned, nothing running: the sweeper's minute
                self.submit(0, "sweeper", sweep_event, 60_000)
        state = self.provider.inspect_key(key)
        raise AssertionError(f"not quiet: outstanding={self.outstanding} state={state}")

    def log(self, thread: str) -> list[dict[str, Any]]:
        item = self.table.get_item(Key={"threadId": thread}, ConsistentRead=True).get("Item")
        return [] if item is None else list(item["messages"])

    def close(self) -> None:
        for inbox, process in zip(self.inboxes, self.processes, strict=True):
            if process.is_alive():
                inbox.put("stop")
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
        self.fake_lambda.close()


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in FAKE_AWS.items():
            patch.setenv(name, value)
        with DynamoDBServer(serialized=True) as server:
            yield server.endpoint_url


def _conversation_table(endpoint: str) -> Any:
    name = f"conversations-{uuid.uuid4().hex[:8]}"
    client = boto3.client("dynamodb", endpoint_url=endpoint, **_boto_args())
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "threadId", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "threadId", "AttributeType": "S"}],
    )
    return boto3.resource("dynamodb", endpoint_url=endpoint, **_boto_args()).Table(name)


def _boto_args() -> dict[str, str]:
    return {
        "region_name": FAKE_AWS["AWS_DEFAULT_REGION"],
        "aws_access_key_id": FAKE_AWS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": FAKE_AWS["AWS_SECRET_ACCESS_KEY"],
    }


@pytest.fixture(params=["dynamodb", "redis"])
def pool(request: pytest.FixtureRequest, moto_endpoint: str) -> Iterator[Pool]:
    """The stack's environment for one backend: the lease backend (a fresh table or key
    prefix), a fresh conversation table, and the variables template.yaml sets."""
    table = _conversation_table(moto_endpoint)
    environ = {
        **FAKE_AWS,
        "AWS_ENDPOINT_URL_DYNAMODB": moto_endpoint,
        "CONVERSATION_TABLE_NAME": table.name,
        "LEASEGUARD_WORKER_FUNCTION": WORKER_NAME,
        "LEASEGUARD_BACKEND": request.param,
        "LEASEGUARD_TTL_MS": str(TTL_MS),
        # Owners hand the thread on after a few messages, so bursts exercise handoffs.
        "MAX_MESSAGES_PER_RUN": "4",
        "POWERTOOLS_SERVICE_NAME": "leaseguard-chat",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    if request.param == "dynamodb":
        from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

        lease_table = f"leases-{uuid.uuid4().hex[:8]}"
        DynamoDBLeaseProvider(lease_table, endpoint_url=moto_endpoint).create_table()
        environ |= {"LEASEGUARD_TABLE_NAME": lease_table, "LEASEGUARD_CLOCK_SKEW_MS": "200"}
    else:
        environ |= {
            "LEASEGUARD_REDIS_URL": request.getfixturevalue("redis_url"),
            "LEASEGUARD_KEY_PREFIX": f"sam{uuid.uuid4().hex[:8]}:",
        }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_endpoint)
        provider = ProviderConfig.from_env(environ).build()
    pool = Pool(environ, provider, table)
    try:
        yield pool
    finally:
        pool.close()


def api_event(thread: str, text: str) -> dict[str, Any]:
    """``events/thread_worker/api_post_message.json`` for another thread and text."""
    event = json.loads((EVENTS / "thread_worker" / "api_post_message.json").read_text())
    event["pathParameters"]["threadId"] = thread
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/threads/{thread}/messages"
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["body"] = json.dumps({"text": text})
    return event


def async_event(thread: str, text: str) -> dict[str, Any]:
    event = json.loads((EVENTS / "thread_worker" / "async_message.json").read_text())
    return {**event, "threadId": thread, "text": text}


def _assert_fenced(log: list[dict[str, Any]]) -> None:
    tokens = [int(entry["token"]) for entry in log]
    assert tokens == sorted(tokens), tokens  # a later owner never wrote with a lower token
    assert len({entry["id"] for entry in log}) == len(log)  # every message appended once


# -- the tests --------------------------------------------------------------------------------


def test_burst_of_50_messages_from_8_processes(pool: Pool) -> None:
    """8 clients post 50 messages to one thread, each client waiting for its answers; every
    process is also a warm environment for async handoffs. Every message is appended exactly
    once, each client's messages in the order it sent them, with tokens that only rise."""
    pool.start(8)
    thread = f"t-{uuid.uuid4().hex[:8]}"
    sent: dict[int, list[str]] = {p: [] for p in range(8)}
    jobs = []
    for n in range(50):
        client = n % 8
        text = f"m{n:02d}"
        event = api_event(thread, text) if n % 2 == 0 else async_event(thread, text)
        timeout_ms = SHORT_TIMEOUT_MS if client % 2 else LONG_TIMEOUT_MS
        jobs.append(pool.submit(client, "worker", event, timeout_ms))
        sent[client].append(text)
    results = [pool.result(job) for job in jobs]
    pool.wait_quiet(thread)

    assert [r for r in results if r[1] != "ok"] == []
    statuses = []
    for _, _, value in results:
        body = json.loads(value["body"]) if "statusCode" in value else value
        if "statusCode" in value:
            assert value["statusCode"] in (200, 202)
        statuses.append(body["leaseguard"]["status"] if "leaseguard" in body else "owner")
    assert set(statuses) <= {"owner", "forwarded"} and "forwarded" in statuses

    log = pool.log(thread)
    texts = [entry["text"] for entry in log]
    assert sorted(texts) == sorted(f"m{n:02d}" for n in range(50))
    for client, order in sent.items():
        assert [t for t in texts if t in order] == order, f"client {client} out of order"
    _assert_fenced(log)
    # Handoffs by async Invoke went through the Lambda API to a claimed, fenced run.
    assert all("leaseguard_handoff" in event for event in pool.fake_lambda.invocations)


def test_a_drain_batch_of_4_drops_no_message(pool: Pool) -> None:
    """Issue 23 finding 2: with LEASEGUARD_DRAIN_BATCH=4 every batch item dedupes on its own
    id (``current_lease().owner``), so the store refuses none of them as a duplicate."""
    pool.environ = {**pool.environ, "LEASEGUARD_DRAIN_BATCH": "4"}
    pool.start(4)
    thread = f"t-{uuid.uuid4().hex[:8]}"
    jobs = [
        pool.submit(n % 4, "worker", async_event(thread, f"m{n:02d}"), LONG_TIMEOUT_MS)
        for n in range(24)
    ]
    results = [pool.result(job) for job in jobs]
    pool.wait_quiet(thread)
    assert [r for r in results if r[1] != "ok"] == []
    log = pool.log(thread)
    assert sorted(entry["text"] for entry in log) == [f"m{n:02d}" for n in range(24)]
    _assert_fenced(log)


def test_owner_hands_the_thread_on_by_async_invoke(pool: Pool) -> None:
    """An owner whose deadline is too close to run more hands the thread to the next queued
    message by an async Invoke of its own function; the invocation that receives the envelope
    claims the grant and runs the stored message with a higher token."""
    pool.start(1)
    go = pool.context.Event()
    owner = pool.add(hold=(go, False))
    thread = f"t-{uuid.uuid4().hex[:8]}"
    first = pool.submit(owner, "worker", api_event(thread, "hold"), SHORT_TIMEOUT_MS)
    _, _, token = pool.note()
    queued = [f"next-{i}" for i in range(5)]
    for text in queued:
        _, status, value = pool.result(pool.submit(0, "worker", async_event(thread, text), 3_000))
        assert status == "ok" and value["leaseguard"]["status"] == "forwarded"
    go.set()
    _, status, value = pool.result(first)
    assert status == "ok" and value["statusCode"] == 200
    pool.wait_quiet(thread)

    log = pool.log(thread)
    assert [entry["text"] for entry in log] == ["hold", *queued]
    # MAX_MESSAGES_PER_RUN=4: the owner ran its own message and three follow-ups, then sent
    # the lease to the next one by Invoke; that run drained the rest.
    assert [int(entry["token"]) for entry in log[:4]] == [token] * 4
    assert int(log[4]["token"]) > token
    _assert_fenced(log)
    envelopes = [event["leaseguard_handoff"] for event in pool.fake_lambda.invocations]
    assert [(e["key"], e["token"]) for e in envelopes] == [(thread, int(log[4]["token"]))]


def test_sweeper_delivers_what_a_killed_owner_left_queued(pool: Pool) -> None:
    """The owner of a thread is SIGKILLed before it writes; five messages wait behind it. No
    new message comes for the thread: the sweeper adopts it once the lease expires and hands
    it to the worker by async Invoke, which appends all six, the killed owner's own first."""
    pool.start(1)  # environment 0 posts the follow-ups, runs the sweeper and serves async invokes
    go = pool.context.Event()
    victim = pool.add(hold=(go, True))
    thread = f"t-{uuid.uuid4().hex[:8]}"

    crashed = pool.submit(victim, "worker", async_event(thread, "hold"), LONG_TIMEOUT_MS)
    _, dead_owner, dead_token = pool.note()
    queued = [f"after-{i}" for i in range(5)]
    for text in queued:
        job = pool.submit(0, "worker", api_event(thread, text), SHORT_TIMEOUT_MS)
        _, status, value = pool.result(job)
        assert status == "ok" and value["statusCode"] == 202  # forwarded to the owner
        assert json.loads(value["body"])["leaseguard"]["holder"] == dead_owner
    go.set()
    pool.processes[victim].join(30)
    assert pool.processes[victim].exitcode == -signal.SIGKILL
    pool.outstanding.discard(crashed)  # Lambda would retry it; here the sweeper must cope
    assert pool.log(thread) == []

    sweep_event = json.loads((EVENTS / "sweeper" / "schedule.json").read_text())
    dispatched = 0
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while not dispatched:
        assert time.monotonic() < deadline, "the sweeper never adopted the thread"
        _, status, value = pool.result(pool.submit(0, "sweeper", sweep_event, 60_000))
        assert status == "ok", value
        dispatched += value["dispatched"]
        time.sleep(0.2)
    pool.wait_quiet(thread)

    log = pool.log(thread)
    assert [entry["text"] for entry in log] == ["hold", *queued]
    assert log[0]["id"] == dead_owner  # the killed owner's own message, run again, once
    assert all(int(entry["token"]) > dead_token for entry in log)
    _assert_fenced(log)


def test_a_stale_owners_append_is_refused(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conversation log's fence: after a write with token 11, a write with token 10 (an
    owner whose lease ran out while it was paused) is refused; a message already in the log is
    not appended twice; the current owner's next write goes through."""
    table = _conversation_table(moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_endpoint)
    monkeypatch.setenv("CONVERSATION_TABLE_NAME", table.name)
    worker = _load(WORKER_PATH, "thread_worker_app_fence")
    assert worker.append("t-1", "req-a", "first", 11) is True
    with pytest.raises(worker.StaleOwner):
        worker.append("t-1", "req-b", "from a paused owner", 10)
    assert worker.append("t-1", "req-a", "first", 11) is False  # run again: appended once
    assert worker.append("t-1", "req-c", "second", 11) is True
    assert worker.append("t-1", "req-d", "next owner", 12) is True
    item = table.get_item(Key={"threadId": "t-1"}, ConsistentRead=True)["Item"]
    assert [m["text"] for m in item["messages"]] == ["first", "second", "next owner"]
    assert item["fence"] == 12 and item["ids"] == {"req-a", "req-c", "req-d"}


# -- the local run in docs/deploy.md ----------------------------------------------------------


def _local_run_script() -> str:
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = text.split("## Run it locally", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_local_run_in_docs_deploy_md(tmp_path: Path) -> None:
    """The commands docs/deploy.md gives for a local run, run as written (on a free port
    instead of 8000): a moto DynamoDB, the tables, then `leaseguard invoke` of each function
    with the sample events."""
    script = _local_run_script().replace("8000", str(free_port()))
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LEASEGUARD_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    process = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=120)
    finally:
        # Whatever the script left running (its background server) is in its process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    assert process.returncode == 0, output
    answers = [json.loads(block) for block in re.findall(r"^\{\n.*?^\}$", output, re.M | re.S)]
    posted, direct, envelope, sweep = answers
    assert posted["statusCode"] == 200 and json.loads(posted["body"])["appended"] == 1
    assert direct == {"threadId": "t-42", "appended": 1, "token": direct["token"]}
    assert direct["token"] > json.loads(posted["body"])["token"]
    assert envelope["leaseguard"]["status"] == "rejected"  # a stale envelope runs nothing
    assert sweep == {"dispatched": 0, "keys": []}


# -- the provider built at init -----------------------------------------------------------------


def test_the_backend_client_is_built_at_import_and_tests_can_swap_it(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a backend named, the worker's provider exists once its module is imported (Lambda's
    init phase), the batch worker shares it, and the guard uses it; a test's use_provider takes
    its place and gives it back. Without one, the guard resolves the environment's on use."""
    from leaseguard.config import provider_from_env
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
    from leaseguard.providers.memory import InMemoryLeaseProvider
    from leaseguard.testing import use_provider

    table = _conversation_table(moto_endpoint)
    for name, value in {**FAKE_AWS, "AWS_ENDPOINT_URL_DYNAMODB": moto_endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CONVERSATION_TABLE_NAME", table.name)
    monkeypatch.setenv("LEASEGUARD_BACKEND", "dynamodb")
    monkeypatch.setenv("LEASEGUARD_TABLE_NAME", f"leases-{uuid.uuid4().hex[:8]}")
    worker = _load(WORKER_PATH, "thread_worker_app_init")
    assert isinstance(worker.PROVIDER, DynamoDBLeaseProvider)
    assert worker.PROVIDER is provider_from_env()  # the one the environment describes
    guard = worker.handler.__wrapped__.__leaseguard__  # under the Tracer's wrapper
    assert guard._provider is worker.PROVIDER  # given as provider=, not looked up on use
    assert guard.provider is worker.PROVIDER
    memory = InMemoryLeaseProvider()
    with use_provider(memory):
        assert guard.provider is memory
        answer = worker.handler(async_event("t-init", "on the test's provider"), LambdaContext())
        assert answer["appended"] == 1
        assert memory.get_lease_owner("t-init") is None  # released on the memory provider
    assert guard.provider is worker.PROVIDER

    monkeypatch.delenv("LEASEGUARD_BACKEND")
    monkeypatch.delenv("LEASEGUARD_TABLE_NAME")
    bare = _load(WORKER_PATH, "thread_worker_app_bare")
    assert bare.PROVIDER is None
