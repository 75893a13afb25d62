"""The SAM app under ``sam local``, once per lease backend (redis, dynamodb on moto).

Run by ``make sam-local`` (sam-local/run.sh), which builds the app for x86_64 and the Lambda
image, starts Docker and sets SAM_LOCAL_* below. Not part of ``make test``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from harness import (
    BATCH_WORKER,
    CONVERSATIONS,
    FAKE_CREDENTIALS,
    LEASE_TTL_MS,
    LEASES,
    REGION,
    ROOT,
    SWEEPER,
    WORKER,
    Gate,
    Process,
    free_port,
    reports,
    wait_for_port,
)

from leaseguard.providers.base import BaseLeaseProvider

GATEWAY = os.environ.get("SAM_LOCAL_GATEWAY", "")
IMAGE = os.environ.get("SAM_LOCAL_IMAGE", "")
BUILD_DIR = Path(os.environ.get("SAM_LOCAL_BUILD_DIR", ROOT / ".aws-sam" / "sam-local"))
# The built template without the functions' Layers: the layer is in IMAGE (sam-local/app-image.sh).
TEMPLATE = Path(os.environ.get("SAM_LOCAL_TEMPLATE", BUILD_DIR / "template-local.yaml"))
SAM = os.environ.get("SAM_LOCAL_SAM", str(ROOT / ".venv-sam" / "bin" / "sam"))
RESULTS = Path(os.environ.get("SAM_LOCAL_RESULTS", BUILD_DIR / "results.jsonl"))
RUN_DIR = Path(os.environ.get("SAM_LOCAL_RUN_DIR", BUILD_DIR / "run"))
LEASEGUARD_CLI = str(Path(sys.executable).with_name("leaseguard"))


def pytest_configure(config: pytest.Config) -> None:
    if not GATEWAY or not IMAGE:
        raise pytest.UsageError("run this suite with make sam-local (SAM_LOCAL_* are not set)")
    os.environ.update(FAKE_CREDENTIALS, AWS_DEFAULT_REGION=REGION, SAM_CLI_TELEMETRY="0")


def record(entry: dict[str, Any]) -> None:
    """A measurement, kept in RESULTS (run.sh prints them); never asserted on."""
    with RESULTS.open("a") as sink:
        sink.write(json.dumps(entry) + "\n")


@dataclass
class Message:
    id: str
    text: str
    token: int


@dataclass
class App:
    backend: str
    work: Path
    processes: list[Process] = field(default_factory=list)
    gate: Gate | None = None
    moto_url: str = ""
    redis_url: str = ""
    api_url: str = ""
    lambda_url: str = ""
    env_vars: Path | None = None
    overrides: str = ""

    # -- what a test uses ---------------------------------------------------------------------

    def thread(self, name: str) -> str:
        return f"{self.backend}-{name}-{uuid.uuid4().hex[:8]}"

    def post(self, thread: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST /threads/{thread}/messages through start-api: (status, JSON body)."""
        request = urllib.request.Request(
            f"{self.api_url}/threads/{thread}/messages",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            text = error.read()
            try:
                return error.code, json.loads(text or b"{}")
            except ValueError:
                return error.code, {"raw": text.decode(errors="replace")}

    def messages(self, thread: str) -> list[Message]:
        """The thread's log in the conversations store, read from moto directly."""
        item = self.dynamodb().get_item(
            TableName=CONVERSATIONS, Key={"threadId": {"S": thread}}, ConsistentRead=True
        )
        rows = item.get("Item", {}).get("messages", {}).get("L", [])
        return [
            Message(row["M"]["id"]["S"], row["M"]["text"]["S"], int(row["M"]["token"]["N"]))
            for row in rows
        ]

    def wait_for_messages(self, thread: str, count: int, timeout_s: float = 90) -> list[Message]:
        deadline = time.monotonic() + timeout_s
        while True:
            log = self.messages(thread)
            if len(log) >= count or time.monotonic() > deadline:
                return log
            time.sleep(0.5)

    def provider(self) -> BaseLeaseProvider:
        if self.backend == "redis":
            from leaseguard.providers.redis import RedisLeaseProvider

            return RedisLeaseProvider.from_url(self.redis_url)
        from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

        return DynamoDBLeaseProvider(LEASES, endpoint_url=self.moto_url, region_name=REGION)

    def dynamodb(self) -> Any:
        return boto3.client("dynamodb", endpoint_url=self.moto_url, region_name=REGION)

    def lambda_client(self) -> Any:
        return boto3.client("lambda", endpoint_url=self.lambda_url, region_name=REGION)

    def cli(self, *args: str) -> str:
        """``leaseguard ARGS`` against this backend; its output (it must succeed)."""
        if self.backend == "redis":
            backend = ["--redis-url", self.redis_url]
        else:
            backend = ["--dynamodb-endpoint", self.moto_url, "--table", LEASES]
        done = subprocess.run(
            [LEASEGUARD_CLI, *args, *backend],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr + done.stdout
        return done.stdout

    def sam_logs(self) -> str:
        return "\n".join(p.text() for p in self.processes if "sam" in p.log.name)

    # -- setting it up ------------------------------------------------------------------------

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        moto_port = free_port(GATEWAY)
        moto = Process(
            [
                sys.executable,
                "-m",
                "leaseguard.testing.dynamodb_server",
                "--host",
                GATEWAY,
                "--port",
                str(moto_port),
            ],
            self.work / "moto.log",
        )
        self.processes.append(moto)
        wait_for_port(GATEWAY, moto_port, moto.popen, "the moto server")
        self.moto_url = f"http://{GATEWAY}:{moto_port}"
        self.dynamodb().create_table(
            TableName=CONVERSATIONS,
            KeySchema=[{"AttributeName": "threadId", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "threadId", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        self.gate = Gate(GATEWAY, (GATEWAY, moto_port))
        variables: dict[str, str] = {"CONVERSATION_TABLE_NAME": CONVERSATIONS}
        overrides = {
            "Architecture": "x86_64",
            "LeaseBackend": self.backend,
            "LeaseTtlMs": str(LEASE_TTL_MS),
            "LocalDynamoDBEndpoint": self.gate.url,
        }
        if self.backend == "redis":
            redis_port = free_port(GATEWAY)
            redis = Process(
                [
                    "redis-server",
                    "--bind",
                    GATEWAY,
                    "--port",
                    str(redis_port),
                    # Bound on the bridge only, which nothing outside this machine reaches.
                    "--protected-mode",
                    "no",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                self.work / "redis.log",
            )
            self.processes.append(redis)
            wait_for_port(GATEWAY, redis_port, redis.popen, "redis-server")
            self.redis_url = f"redis://{GATEWAY}:{redis_port}/0"
            overrides["RedisUrl"] = self.redis_url
            variables["LEASEGUARD_REDIS_URL"] = self.redis_url
        else:
            from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

            DynamoDBLeaseProvider(
                LEASES, endpoint_url=self.moto_url, region_name=REGION
            ).create_table()
            variables["LEASEGUARD_TABLE_NAME"] = LEASES
        lambda_port = free_port(GATEWAY)
        self.lambda_url = f"http://{GATEWAY}:{lambda_port}"
        overrides["LocalLambdaEndpoint"] = self.lambda_url
        # sam local resolves no Fn::If in a function's environment, and passes only variables
        # the template names: the parameters above are for the template's sake, the values
        # the functions see are these.
        variables["AWS_ENDPOINT_URL_DYNAMODB"] = self.gate.url
        variables["AWS_ENDPOINT_URL_LAMBDA"] = self.lambda_url
        sweeper = {k: v for k, v in variables.items() if k != "CONVERSATION_TABLE_NAME"}
        self.env_vars = self.work / "env.json"
        self.env_vars.write_text(
            json.dumps(
                {
                    WORKER: variables,
                    BATCH_WORKER: variables,
                    SWEEPER: {**sweeper, "LEASEGUARD_WORKER_FUNCTION": WORKER},
                },
                indent=2,
            )
        )
        self.overrides = " ".join(f"{k}={v}" for k, v in overrides.items())
        self.cold_start()
        start_lambda = self.sam(
            "start-lambda", "--host", GATEWAY, "--port", str(lambda_port), log="sam-lambda.log"
        )
        api_port = free_port("127.0.0.1")
        self.api_url = f"http://127.0.0.1:{api_port}"
        start_api = self.sam(
            "start-api", "--host", "127.0.0.1", "--port", str(api_port), log="sam-api.log"
        )
        wait_for_port(GATEWAY, lambda_port, start_lambda.popen, "sam local start-lambda")
        wait_for_port("127.0.0.1", api_port, start_api.popen, "sam local start-api")

    def sam_args(self) -> list[str]:
        assert self.env_vars is not None
        return [
            "--template",
            str(TEMPLATE),
            "--invoke-image",
            IMAGE,
            "--skip-pull-image",
            "--env-vars",
            str(self.env_vars),
            "--parameter-overrides",
            self.overrides,
            "--region",
            REGION,
        ]

    def sam(self, command: str, *args: str, log: str) -> Process:
        process = Process([SAM, "local", command, *args, *self.sam_args()], self.work / log)
        self.processes.append(process)
        return process

    def invoke(self, function: str, event: dict[str, Any], name: str) -> tuple[Any, str, float]:
        """``sam local invoke FUNCTION`` with ``event``, in a fresh container: (the function's
        result, the emulator's output, wall seconds). The invocation must succeed."""
        event_file = self.work / f"{name}-event.json"
        event_file.write_text(json.dumps(event))
        started = time.monotonic()
        done = subprocess.run(
            [SAM, "local", "invoke", function, "--event", str(event_file), *self.sam_args()],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        wall_s = time.monotonic() - started
        output = done.stdout + done.stderr
        (self.work / f"sam-invoke-{name}.log").write_text(output)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1]), output, wall_s

    def generate_event(self, *args: str) -> dict[str, Any]:
        """``sam local generate-event ARGS``: a sample event as SAM writes it."""
        done = subprocess.run(
            [SAM, "local", "generate-event", *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        event = json.loads(done.stdout)
        assert isinstance(event, dict), event
        return event

    def cold_start(self) -> None:
        """One ``sam local invoke`` of the worker before the services start: it builds SAM's
        emulator image on top of ours once (not two services at a time), and its REPORT line
        is the cold start of a guarded handler in a fresh container, recorded."""
        thread = self.thread("cold")
        result, output, wall_s = self.invoke(
            WORKER, {"threadId": thread, "text": "cold start"}, "cold-start"
        )
        assert result["appended"] == 1, result
        report = reports(output)
        record(
            {
                "what": "cold start of the guarded worker (sam local invoke)",
                "backend": self.backend,
                # The emulator counts the handler's import in the first Duration: its Init
                # Duration is the custom runtime's bootstrap exec only.
                "init_duration_ms": report[-1][1] if report else None,
                "first_duration_ms": report[-1][2] if report else None,
                "wall_s_with_container_start": round(wall_s, 1),
            }
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        if self.gate is not None:
            self.gate.close()


@pytest.fixture(scope="session", params=["redis", "dynamodb"])
def app(request: pytest.FixtureRequest) -> Iterator[App]:
    running = App(request.param, RUN_DIR / request.param)
    try:
        running.start()
        yield running
    finally:
        running.stop()
