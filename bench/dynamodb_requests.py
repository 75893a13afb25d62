"""Requests and capacity units per lease on DynamoDB: leaseguard against the usual alternatives.

All in one run, on moto's in-process DynamoDB, each library on its own table as its docs
create it:

* leaseguard ``DynamoDBLeaseProvider``: the plain lease (``acquire_lease``, ``renew_lease`` x3,
  ``release_lease``) and the ``@lease_owned`` path (``acquire_or_enqueue``, ``renew_lease`` x3,
  ``transfer_to_next`` with nothing queued), once with a small event (stored inline in the
  lease item) and once with an event over the inline budget (stored in a payload item);
* Powertools for AWS Lambda's idempotency layer (``idempotent_function`` on a
  ``DynamoDBPersistenceLayer``): its record is a lock while a call is in progress;
* ``python-dynamodb-lock`` (``DynamoDBLockClient``: ``acquire_lock``, three heartbeats,
  ``release_lock``);
* ``dynamodblock`` (``DynamoDBLock``: construct, ``acquire``, ``release``).

A lifecycle is acquire, three renewals, release; a contended acquire is one attempt on a key
another owner holds, giving up at once where the library allows it. HTTP requests are counted
with a botocore ``before-send`` hook on each library's own client. Capacity units are computed
from item sizes by DynamoDB's published rules, because moto reports a fixed ``ConsumedCapacity``
(0.5 for every UpdateItem): a write costs one write unit per KB of the larger of the item
before and after it (a delete: the item before), a refused conditional write still costs the
size of the existing item, at least one unit each; a global secondary index write costs the same
per KB of index entry (its keys, plus 100 bytes), two when an entry's key changes; a read costs
one read unit per 4 KB (half when eventually consistent). Item sizes are read with a separate,
uncounted client before and after each request.

    .venv/bin/python bench/dynamodb_requests.py
    .venv/bin/python bench/dynamodb_requests.py --write docs/benchmarks.md

Numbers are never asserted anywhere; docs/benchmarks.md holds recorded runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REGION = "us-east-1"
TTL_MS = 30_000
SECTION = "## DynamoDB requests per lease"
WRITES = {"PutItem", "UpdateItem", "DeleteItem"}
KB = 1024
READ_UNIT = 4 * KB
INDEX_ENTRY_OVERHEAD = 100


# -- DynamoDB's size and capacity rules -----------------------------------------------------------


def value_size(value: dict[str, Any]) -> int:
    (kind, body), *_ = value.items()
    if kind == "S":
        return len(str(body).encode("utf-8"))
    if kind == "N":
        digits = str(body).lstrip("-").replace(".", "").strip("0") or "0"
        return math.ceil(len(digits) / 2) + 1
    if kind == "B":
        return len(body)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS", "BS"):
        return sum(value_size({kind[0]: v}) for v in body)
    if kind == "L":
        return 3 + sum(1 + value_size(v) for v in body)
    if kind == "M":
        return 3 + sum(1 + len(k.encode("utf-8")) + value_size(v) for k, v in body.items())
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: dict[str, Any] | None) -> int:
    if not item:
        return 0
    return sum(len(name.encode("utf-8")) + value_size(v) for name, v in item.items())


def write_units(size: int) -> int:
    return max(1, math.ceil(size / KB))


def read_units(size: int, consistent: bool) -> float:
    units = max(1, math.ceil(size / READ_UNIT))
    return units if consistent else units / 2


@dataclass
class Table:
    name: str
    keys: list[str]
    # index name -> its key attribute names
    indexes: dict[str, list[str]] = field(default_factory=dict)

    def key_of(self, item: dict[str, Any]) -> dict[str, Any]:
        return {k: item[k] for k in self.keys}

    def index_entries(self, item: dict[str, Any] | None) -> dict[str, tuple[Any, int]]:
        """Per index the item appears in: its index key values and the entry size."""
        entries: dict[str, tuple[Any, int]] = {}
        if not item:
            return entries
        for index, attrs in self.indexes.items():
            if all(a in item for a in attrs):
                projected = {a: item[a] for a in [*self.keys, *attrs]}
                key = json.dumps([item[a] for a in attrs], sort_keys=True)
                entries[index] = (key, item_size(projected) + INDEX_ENTRY_OVERHEAD)
        return entries


@dataclass
class Tally:
    requests: int = 0
    write_units: float = 0
    read_units: float = 0
    operations: list[str] = field(default_factory=list)

    def cell(self) -> tuple[str, str, str]:
        return str(self.requests), f"{self.write_units:g}", f"{self.read_units:g}"


class Meter:
    """Counts HTTP requests and capacity units of one botocore client."""

    def __init__(self, client: Any, peek: Any, tables: dict[str, Table]) -> None:
        self.peek = peek  # an uncounted client of the same (mocked) DynamoDB
        self.tables = tables
        self.tally = Tally()
        events = client.meta.events
        events.register("before-send.dynamodb.*", self._sent)
        events.register("before-call.dynamodb.*", self._before)
        events.register("after-call.dynamodb.*", self._after)

    @contextlib.contextmanager
    def measure(self) -> Iterator[Tally]:
        """Count what is sent inside the block (blocks nest: the outer one resumes after)."""
        outer, self.tally = self.tally, Tally()
        try:
            yield self.tally
        finally:
            self.tally = outer

    def _sent(self, event_name: str, **_: Any) -> None:
        self.tally.requests += 1
        self.tally.operations.append(event_name.rsplit(".", 1)[-1])

    def _read(self, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
        found = self.peek.get_item(TableName=table, Key=key, ConsistentRead=True)
        return found.get("Item")

    def _before(
        self, model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        body = json.loads(params.get("body") or b"{}")
        context["meter_body"] = body
        if model.name in WRITES:
            table = self.tables[body["TableName"]]
            key = body["Key"] if "Key" in body else table.key_of(body["Item"])
            context["meter_before"] = self._read(table.name, key)
            context["meter_key"] = key
        elif model.name == "BatchWriteItem":
            context["meter_batch"] = [
                (name, key, self._read(name, key))
                for name, requests in body["RequestItems"].items()
                for key in (self._batch_key(self.tables[name], r) for r in requests)
            ]

    def _after(self, model: Any, http_response: Any, parsed: Any, context: dict[str, Any],
               **_: Any) -> None:  # fmt: skip
        body = context.get("meter_body", {})
        name = model.name
        ok = http_response.status_code < 300
        if name in WRITES:
            table = self.tables[body["TableName"]]
            before = context["meter_before"]
            after = self._read(table.name, context["meter_key"])
            if not ok:  # a refused condition still costs the existing item's size
                self.tally.write_units += write_units(item_size(before))
                return
            size = (
                item_size(before)
                if name == "DeleteItem"
                else max(item_size(before), item_size(after))
            )
            self.tally.write_units += write_units(size)
            self.tally.write_units += self._index_writes(table, before, after)
        elif name == "BatchWriteItem" and ok:
            # Each item of a batch is billed as the single write it stands for.
            unprocessed = parsed.get("UnprocessedItems") or {}
            assert not unprocessed, "moto does not throttle"
            for table_name, key, before in context["meter_batch"]:
                table = self.tables[table_name]
                after = self._read(table_name, key)
                self.tally.write_units += write_units(max(item_size(before), item_size(after)))
                self.tally.write_units += self._index_writes(table, before, after)
        elif name == "GetItem" and ok:
            key = body["Key"]
            item = self._read(body["TableName"], key)
            self.tally.read_units += read_units(item_size(item), bool(body.get("ConsistentRead")))
        elif name == "BatchGetItem" and ok:
            for table_name, request in body["RequestItems"].items():
                for key in request["Keys"]:
                    item = self._read(table_name, key)
                    consistent = bool(request.get("ConsistentRead"))
                    self.tally.read_units += read_units(item_size(item), consistent)
        elif name == "Query" and ok:
            table = self.tables[body["TableName"]]
            total = 0
            for item in parsed.get("Items", []):
                full = self._read(table.name, table.key_of(item))
                if "IndexName" in body:
                    total += table.index_entries(full).get(body["IndexName"], (None, 0))[1]
                else:
                    total += item_size(full)
            self.tally.read_units += read_units(total, bool(body.get("ConsistentRead")))

    @staticmethod
    def _batch_key(table: Table, request: dict[str, Any]) -> dict[str, Any]:
        if "DeleteRequest" in request:
            return dict(request["DeleteRequest"]["Key"])
        return table.key_of(request["PutRequest"]["Item"])

    @staticmethod
    def _index_writes(
        table: Table, before: dict[str, Any] | None, after: dict[str, Any] | None
    ) -> int:
        old, new = table.index_entries(before), table.index_entries(after)
        units = 0
        for index in set(old) | set(new):
            if index in old and index in new:
                if old[index][0] != new[index][0]:  # the entry moves: delete + put
                    units += write_units(old[index][1]) + write_units(new[index][1])
            elif index in new:
                units += write_units(new[index][1])
            else:
                units += write_units(old[index][1])
        return units


# -- the contenders -------------------------------------------------------------------------------


@dataclass
class Row:
    library: str
    version: str
    lifecycle: Tally | None
    contended: Tally | None
    notes: str
    failure: str | None = None


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def bench_leaseguard(client: Any, peek: Any) -> list[Row]:
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

    provider = DynamoDBLeaseProvider("lg-bench", client)
    provider.create_table()
    table = Table("lg-bench", ["pk", "sk"], {"orphans": ["gp", "gx"]})
    meter = Meter(client, peek, {"lg-bench": table})
    version = _version("leaseguard")
    key = f"thread-{uuid.uuid4().hex[:8]}"
    owner = str(uuid.uuid4())  # a Lambda request id
    with meter.measure() as plain:
        assert provider.acquire_lease(key, owner, TTL_MS).acquired
        for _ in range(3):
            assert provider.renew_lease(key, owner, TTL_MS)
        provider.release_lease(key, owner)
    provider.acquire_lease(key, owner, TTL_MS)
    with meter.measure() as refused:
        assert not provider.acquire_lease(key, str(uuid.uuid4()), TTL_MS).acquired
    rows = [
        Row(
            "leaseguard `DynamoDBLeaseProvider` (lease)",
            version,
            plain,
            refused,
            "refusal names the holder and its token, from the same request",
        )
    ]

    small = {"body": json.dumps({"threadId": key, "text": "hello " * 20})}
    large = {"body": json.dumps({"threadId": key, "text": "hello " * 400})}
    for event, label, how in (
        (small, "", "inline in the lease item, by the grant or append itself"),
        (large, ", event over the inline budget", "in a payload item written first"),
    ):
        owned, queued, stored = _signal_path(provider, meter, event)
        rows.append(
            Row(
                f"leaseguard `@lease_owned` path (signal queue{label})",
                version,
                owned,
                queued,
                f"stores the event ({stored} bytes of JSON here) {how}, so a crash re-delivers "
                "it, and indexes the key for the sweeper; a contended call queues its event for "
                "the owner",
            )
        )
    return rows


def _signal_path(provider: Any, meter: Meter, event: dict[str, Any]) -> tuple[Tally, Tally, int]:
    """One ``@lease_owned`` lifecycle of ``event`` on a fresh key, then a forward of it while
    another event holds the key: the two tallies and the event's stored size."""
    from leaseguard import Signal
    from leaseguard.signals import encode_signal

    signal_key = f"thread-{uuid.uuid4().hex[:8]}"
    first = Signal(str(uuid.uuid4()), event)
    stored = len(encode_signal(first).encode("utf-8"))
    with meter.measure() as owned:
        assert provider.acquire_or_enqueue(signal_key, first, TTL_MS).acquired
        for _ in range(3):
            assert provider.renew_lease(signal_key, first.id, TTL_MS)
        assert provider.transfer_to_next(signal_key, first.id, TTL_MS) is None
    # Another event holds the key (``first`` completed: it is remembered and would be a
    # duplicate now).
    holder = Signal(str(uuid.uuid4()), event)
    assert provider.acquire_or_enqueue(signal_key, holder, TTL_MS).acquired
    with meter.measure() as queued:
        result = provider.acquire_or_enqueue(signal_key, Signal(str(uuid.uuid4()), event), TTL_MS)
        assert not result.acquired and result.position == 1
    return owned, queued, stored


def bench_powertools(client: Any, peek: Any) -> Row:
    name = "Powertools idempotency (`DynamoDBPersistenceLayer`)"
    try:
        from aws_lambda_powertools.utilities.idempotency import (
            DynamoDBPersistenceLayer,
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.exceptions import (
            IdempotencyAlreadyInProgressError,
        )

        from leaseguard.testing import LambdaContext
    except ImportError as exc:
        return Row(name, "not installed", None, None, "", failure=str(exc))
    version = _version("aws-lambda-powertools")
    client.create_table(  # the table its documentation asks for
        TableName="powertools-bench",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    meter = Meter(client, peek, {"powertools-bench": Table("powertools-bench", ["id"])})
    layer = DynamoDBPersistenceLayer(table_name="powertools-bench", boto3_client=client)
    config = IdempotencyConfig(expires_after_seconds=3600)
    config.register_lambda_context(LambdaContext())  # so the in-progress record expires too
    contended: list[Tally] = []

    @idempotent_function(data_keyword_argument="event", persistence_store=layer, config=config)
    def handle(event: dict[str, Any]) -> dict[str, Any]:
        # A second delivery of the same event while this one runs: Powertools refuses it.
        with meter.measure() as refused, contextlib.suppress(IdempotencyAlreadyInProgressError):
            handle(event=event)
        contended.append(refused)
        return {"ok": True}

    event = {"threadId": uuid.uuid4().hex, "text": "hello " * 20}
    with meter.measure() as lifecycle:
        handle(event=event)
    return Row(
        name,
        version,
        lifecycle,
        contended[0],
        "no renewal (the in-progress record lasts for the Lambda timeout), and a completed "
        "record stays until it expires: it is idempotency, not a reusable lease",
    )


def bench_python_dynamodb_lock(client: Any, peek: Any, resource: Any) -> Row:
    name = "`python-dynamodb-lock` (`DynamoDBLockClient`)"
    try:
        from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient, DynamoDBLockError
    except ImportError as exc:
        return Row(name, "not installed", None, None, "", failure=str(exc))
    import datetime

    version = _version("python-dynamodb-lock")
    DynamoDBLockClient.create_dynamodb_table(client, table_name="pdl-bench")
    meter = Meter(
        resource.meta.client, peek, {"pdl-bench": Table("pdl-bench", ["lock_key", "sort_key"])}
    )
    # The heartbeat thread would renew on its own schedule; an hour keeps it asleep so the three
    # renewals are the ones sent below, through the library's own heartbeat method.
    hour = datetime.timedelta(hours=1)
    holder = DynamoDBLockClient(resource, table_name="pdl-bench", heartbeat_period=hour)
    other = DynamoDBLockClient(resource, table_name="pdl-bench", heartbeat_period=hour)
    key = uuid.uuid4().hex
    with meter.measure() as lifecycle:
        lock = holder.acquire_lock(key)
        for _ in range(3):
            holder._send_heartbeat(lock)
        holder.release_lock(lock)
    lock = holder.acquire_lock(key)
    tiny = datetime.timedelta(milliseconds=1)
    with meter.measure() as contended:
        try:
            other.acquire_lock(key, retry_period=hour, retry_timeout=tiny)
        except DynamoDBLockError as exc:
            assert exc.code == DynamoDBLockError.ACQUIRE_TIMEOUT
    holder.release_lock(lock)
    # Not close(): it joins the heartbeat threads, which sleep for the hour set above. They are
    # daemon threads and end with the process.
    return Row(
        name,
        version,
        lifecycle,
        contended,
        "acquire reads before it writes; renewals are its heartbeats (sent here directly); "
        "expiry is judged by watching the record version for a lease duration",
    )


def bench_dynamodblock(client: Any, peek: Any, resource: Any) -> Row:
    name = "`dynamodblock` (`DynamoDBLock`)"
    try:
        from dynamodblock import DynamoDBLock, DynamoDBLockTimeoutError
    except ImportError as exc:
        return Row(name, "not installed", None, None, "", failure=str(exc))
    version = _version("dynamodblock")
    client.create_table(  # the schema of its create_ddb_table.tf
        TableName="ddblock-bench",
        KeySchema=[{"AttributeName": "lock_id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "lock_id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    meter = Meter(
        resource.meta.client, peek, {"ddblock-bench": Table("ddblock-bench", ["lock_id"])}
    )
    table = resource.Table("ddblock-bench")
    key = uuid.uuid4().hex
    with meter.measure() as lifecycle:
        lock = DynamoDBLock(key, table, lock_ttl=30)
        lock.acquire()
        lock.release()
    holder = DynamoDBLock(key, table, lock_ttl=30)
    holder.acquire()
    # Its quickest give-up: retry_timeout has a floor of 0.5 s.
    with meter.measure() as contended, contextlib.suppress(DynamoDBLockTimeoutError):
        DynamoDBLock(key, table, lock_ttl=30, retry_timeout=0.5, retry_interval=0.4).acquire()
    holder.release()
    return Row(
        name,
        version,
        lifecycle,
        contended,
        "no renewal; a lock object per key (its constructor loads the table description); "
        "a contended acquire polls every retry_interval until retry_timeout (here 0.4 s and its "
        "0.5 s minimum)",
    )


# -- running and reporting ------------------------------------------------------------------------


def run() -> list[Row]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    import boto3
    from moto import mock_aws

    with mock_aws():
        session = boto3.session.Session(region_name=REGION)
        peek = session.client("dynamodb")
        rows = bench_leaseguard(session.client("dynamodb"), peek)
        rows.append(bench_powertools(session.client("dynamodb"), peek))
        rows.append(
            bench_python_dynamodb_lock(
                session.client("dynamodb"), peek, session.resource("dynamodb")
            )
        )
        rows.append(
            bench_dynamodblock(session.client("dynamodb"), peek, session.resource("dynamodb"))
        )
    return rows


def _dash(tally: Tally | None) -> tuple[str, str, str]:
    return tally.cell() if tally is not None else ("—", "—", "—")


def _operations(tally: Tally | None) -> str:
    if tally is None:
        return "—"
    counts: dict[str, int] = {}
    for op in tally.operations:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())


def machine() -> list[str]:
    try:
        done = subprocess.run(["uname", "-a"], capture_output=True, text=True, check=True)
        uname = done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        uname = " ".join(platform.uname())
    return [
        f"- `uname -a`: {uname}",
        f"- `nproc`: {os.cpu_count()}",
        f"- Python {platform.python_version()}, boto3 {_version('boto3')}, moto {_version('moto')}",
    ]


def render(rows: list[Row]) -> str:
    lines = [
        SECTION,
        "",
        "Requests and capacity units of one lease on DynamoDB, counted on moto in one run "
        "(`bench/dynamodb_requests.py`). A *lifecycle* is acquire, three renewals and release; a "
        "*contended* acquire is one attempt on a key someone else holds. Requests are the HTTP "
        "requests botocore sent (a `before-send` hook); write and read units (WCU/RCU; on-demand "
        "WRU/RRU are the same units) are computed from item sizes by DynamoDB's rules, since "
        "moto reports a fixed `ConsumedCapacity`: 1 WCU per KB of the larger of the item before "
        "and after a write (a refused conditional write pays for the existing item), index "
        "entries likewise, 1 RCU per 4 KB of a strongly consistent read (half when eventually "
        "consistent), at least one unit per item.",
        "",
        "| library | version | lifecycle requests | lifecycle WCU | lifecycle RCU "
        "| contended requests | contended WCU | contended RCU |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row.failure:
            lines.append(
                f"| {row.library} | {row.version} | could not run: {row.failure} | | | | | |"
            )
            continue
        life, contended = _dash(row.lifecycle), _dash(row.contended)
        lines.append(f"| {row.library} | {row.version} | {' | '.join(life + contended)} |")
    lines += ["", "What each one sent:", ""]
    for row in rows:
        if row.failure:
            continue
        lines.append(
            f"- {row.library}: lifecycle {_operations(row.lifecycle)}; contended "
            f"{_operations(row.contended)}. {row.notes[0].upper()}{row.notes[1:]}."
        )
    lines += [
        "",
        "Machine and command:",
        "",
        *machine(),
        "- `.venv/bin/python bench/dynamodb_requests.py --write docs/benchmarks.md`",
        f"- recorded {time.strftime('%Y-%m-%d', time.gmtime())}",
        "",
    ]
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    """Replace (or append) only this benchmark's section: others write theirs in the same file.
    The file is read right before it is written."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        before = "\n".join(lines[:start]).rstrip("\n")
        after = "\n".join(lines[end:])
        new = (before + "\n\n" if before else "") + section + ("\n" + after if after else "")
    path.write_text(new.rstrip("\n") + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="update this section of a markdown file")
    args = parser.parse_args(argv)
    section = render(run())
    print(section)
    if args.write:
        write_section(args.write, section)
        print(f"wrote the section to {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
