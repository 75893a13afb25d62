"""A local DynamoDB endpoint for tests: moto's server app, with each request run under one lock.

moto's server mode handles requests on several threads and its conditional writes are not
atomic: two clients can both pass the same ``ConditionExpression`` on one item. Real DynamoDB
serialises writes to an item, so a test of leases against raw moto can fail for moto's sake.
:class:`DynamoDBServer` runs moto's WSGI app (``DomainDispatcherApplication``, the app that
``moto_server`` serves) in a child process on 127.0.0.1 and, by default, holds one
:class:`threading.Lock` around every request, which makes each request atomic as DynamoDB's
are. ``serialized=False`` serves raw
moto, to show that a race checker does catch what the lock prevents.

The server is a separate process (not a thread of the test process) so that many client
processes are served without competing with the test process's own interpreter lock.

>>> with DynamoDBServer() as server:  # doctest: +SKIP
...     provider = DynamoDBLeaseProvider("t", endpoint_url=server.endpoint_url,
...                                      region_name="us-east-1")

Run it by hand with ``python -m leaseguard.testing.dynamodb_server --port 8000``.

moto does not enforce DynamoDB's item limit as DynamoDB does: it sums its own idea of the
sizes while it sets each attribute, counting the attribute being replaced twice, against
405,000 bytes. So a test on raw moto can neither see a write that real DynamoDB refuses nor
pass one that real DynamoDB accepts. :func:`install_item_size_limit` (applied to every app
this module builds) replaces that check: after each ``PutItem`` / ``UpdateItem`` (also inside
``BatchWriteItem``) the item's size is computed by DynamoDB's own rules
(:func:`item_size`) and a write that leaves it above 400 KB (409,600 bytes) is undone and
refused with the ``ValidationException`` DynamoDB returns.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from leaseguard.errors import check_installed
from leaseguard.testing.servers import ManagedServer, free_port

ITEM_LIMIT_BYTES = 400 * 1024
"""DynamoDB's item size limit ("400 KB"; moto's own notes find the real edge at 409-410 KB)."""

_START_TIMEOUT_S = 30.0
_START_TRIES = 3

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class SerializedApp:
    """A WSGI app that runs ``app`` for one request at a time. The response body is read
    inside the lock too, since a WSGI app may do its work lazily while it is iterated."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        with self.lock:
            response = self.app(environ, start_response)
            try:
                return [b"".join(response)]
            finally:
                close = getattr(response, "close", None)
                if close is not None:
                    close()


def value_size(kind: str, body: Any) -> int:
    """One attribute value's size by DynamoDB's rules (CapacityUnitCalculations): a string
    its UTF-8 bytes, a number 1 byte per two significant digits plus 1, a binary its raw
    bytes, a list or map 3 bytes plus 1 per element (plus each key's bytes in a map), a set
    the sum of its elements, a boolean or null 1 byte. ``body`` is moto's stored value:
    nested values are moto ``DynamoType`` objects (``.type``, ``.value``), binaries bytes or
    base64 text."""
    if kind == "S":
        return len(str(body).encode("utf-8"))
    if kind == "N":
        return _number_size(str(body))
    if kind == "B":
        return len(_raw_bytes(body))
    if kind == "L":
        return 3 + sum(1 + value_size(v.type, v.value) for v in body)
    if kind == "M":
        return 3 + sum(
            1 + len(k.encode("utf-8")) + value_size(v.type, v.value) for k, v in body.items()
        )
    if kind == "SS":
        return sum(len(str(v).encode("utf-8")) for v in body)
    if kind == "NS":
        return sum(_number_size(str(v)) for v in body)
    if kind == "BS":
        return sum(len(_raw_bytes(v)) for v in body)
    return 1  # BOOL, NULL


def _number_size(text: str) -> int:
    mantissa = text.lower().split("e")[0].lstrip("+-").replace(".", "")
    digits = mantissa.strip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def _raw_bytes(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    import base64

    return base64.b64decode(str(body))


def item_size(attrs: Mapping[str, Any]) -> int:
    """An item's size by DynamoDB's rules: each attribute name's UTF-8 bytes plus its value's
    size (``attrs`` maps names to moto ``DynamoType`` values)."""
    return sum(len(name.encode("utf-8")) + value_size(v.type, v.value) for name, v in attrs.items())


def install_item_size_limit() -> None:
    """Make this process's moto refuse writes by DynamoDB's item limit instead of its own
    (see the module docstring). Idempotent."""
    from moto.dynamodb.exceptions import ItemSizeTooLarge, ItemSizeToUpdateTooLarge
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType, LimitedSizeDict
    from moto.dynamodb.models.table import Table

    if getattr(DynamoDBBackend.update_item, "_leaseguard_sized", False):
        return
    # moto's own count (which includes the value being replaced) is replaced, not added to
    LimitedSizeDict.__setitem__ = dict.__setitem__  # type: ignore[method-assign]
    original_update = DynamoDBBackend.update_item
    original_put = Table.put_item

    def update_item(self: Any, table_name: str, key: Any, *args: Any, **kwargs: Any) -> Any:
        table = self.get_table(table_name)
        hash_value, range_value = self.get_keys_value(table, key)
        before = table.get_item(hash_value, range_value)
        saved = copy.deepcopy(before.attrs) if before is not None else None
        item = original_update(self, table_name, key, *args, **kwargs)
        if item_size(item.attrs) > ITEM_LIMIT_BYTES:
            if saved is None:
                table.delete_item(hash_value, range_value)
            else:
                item.attrs = saved  # the stored Item was changed in place: put it back
            raise ItemSizeToUpdateTooLarge()
        return item

    def put_item(self: Any, item_attrs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        typed = {name: DynamoType(value) for name, value in item_attrs.items()}
        if item_size(typed) > ITEM_LIMIT_BYTES:
            raise ItemSizeTooLarge()
        return original_put(self, item_attrs, *args, **kwargs)

    update_item._leaseguard_sized = True  # type: ignore[attr-defined]
    DynamoDBBackend.update_item = update_item  # type: ignore[method-assign]
    Table.put_item = put_item  # type: ignore[method-assign]


def make_app(serialized: bool = True) -> WSGIApp:
    """moto's app for every service (DynamoDB included), optionally serialized, with
    DynamoDB's item limit (:func:`install_item_size_limit`)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    install_item_size_limit()

    app: WSGIApp = DomainDispatcherApplication(create_backend_app)
    return SerializedApp(app) if serialized else app


def serve(
    port: int,
    *,
    host: str = "127.0.0.1",
    serialized: bool = True,
    switch_interval_s: float | None = None,
) -> None:
    """Serve until the process is stopped (what the child process runs)."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    class QuietHandler(MotoRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass  # thousands of requests per test: a log line each only costs time

    if switch_interval_s is not None:
        # Shorter time slices interleave the server's request threads more often, the way
        # truly parallel handlers would; only meaningful for the raw (unserialized) app.
        sys.setswitchinterval(switch_interval_s)
    server = make_server(
        host, port, make_app(serialized), threaded=True, request_handler=QuietHandler
    )
    server.serve_forever()


class DynamoDBServer(ManagedServer):
    """moto's DynamoDB on ``127.0.0.1:<port>`` in a child process; stop it with :meth:`stop`
    or use it as a context manager. Any region and any credentials are accepted."""

    def __init__(
        self,
        serialized: bool = True,
        *,
        port: int | None = None,
        switch_interval_s: float | None = None,
        python: str | None = None,
    ) -> None:
        self.serialized = serialized
        self.port = port or free_port()
        self._fixed_port = port is not None
        self.switch_interval_s = switch_interval_s
        self.python = python or sys.executable
        self.process: subprocess.Popen[bytes] | None = None
        self._log_dir: str | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command_line(self) -> list[str]:
        args = [self.python, "-m", "leaseguard.testing.dynamodb_server", "--port", str(self.port)]
        if not self.serialized:
            args.append("--raw")
        if self.switch_interval_s is not None:
            args += ["--switch-interval", repr(self.switch_interval_s)]
        return args

    def start(self) -> DynamoDBServer:
        if self.process is not None:
            return self
        if self.python == sys.executable:  # the child's import error would read as a crash
            check_installed("testing", "DynamoDBServer (moto's server)", "moto", "flask")
        self._log_dir = tempfile.mkdtemp(prefix="leaseguard-moto-")
        for attempt in range(_START_TRIES):
            log = Path(self._log_dir, "server.log")
            with log.open("wb") as sink:
                self.process = subprocess.Popen(
                    self.command_line(),
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            if self._wait_until_ready():
                return self
            detail = log.read_text(errors="replace")[-2000:]
            self._kill()
            # Someone else may have bound the free port first: try another one.
            if self._fixed_port or attempt == _START_TRIES - 1:
                self.cleanup()
                raise RuntimeError(f"moto server on port {self.port} did not start: {detail}")
            self.port = free_port()
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_until_ready(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"GET /moto-api/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                    if sock.recv(16).startswith(b"HTTP/"):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def _kill(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def stop(self) -> None:
        """Stop the child process by its pid (SIGTERM, then SIGKILL after 10 s)."""
        self.cleanup()

    def cleanup(self) -> None:
        self._kill()
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="moto DynamoDB, one request at a time")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--raw", action="store_true", help="no lock: moto as it is")
    parser.add_argument("--switch-interval", type=float, default=None)
    args = parser.parse_args(argv)
    serve(
        args.port,
        host=args.host,
        serialized=not args.raw,
        switch_interval_s=args.switch_interval,
    )


if __name__ == "__main__":
    main()
