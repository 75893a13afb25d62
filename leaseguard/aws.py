"""One boto3 session per process, shared by every AWS client leaseguard makes.

Creating a boto3 client costs tens of milliseconds, most of it loading the service model; one
session caches that model, so each further client is cheap, and a warm Lambda environment
reuses the clients across invocations. Sessions are not thread-safe, so clients are made under
a lock, and a forked child starts over (it must not inherit a lock another thread held).
boto3 is imported on the first call, never at import time.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from leaseguard.errors import extra_required


class _SharedSession:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session: Any = None
        self.defaults: dict[str, Any] = {}

    def get(self) -> Any:
        with self.lock:
            if self.session is None:
                with extra_required("dynamodb", "leaseguard's AWS clients (DynamoDB, Lambda, SQS)"):
                    import boto3

                self.session = boto3.session.Session()
            return self.session

    def client(self, service: str, **options: Any) -> Any:
        session = self.get()
        with self.lock:
            return session.client(service, **options)

    def default_client(self, service: str) -> Any:
        made = self.defaults.get(service)
        if made is None:
            made = self.defaults.setdefault(service, self.client(service))
        return made

    def forget(self) -> None:
        self.lock = threading.Lock()
        self.session = None
        self.defaults.clear()


_SHARED = _SharedSession()
os.register_at_fork(after_in_child=_SHARED.forget)


def session() -> Any:
    """The process's boto3 session (credentials and region as the environment sets them)."""
    return _SHARED.get()


def client(service: str, **options: Any) -> Any:
    """A new client for ``service`` from the process's session (``options``: endpoint_url,
    region_name, a botocore ``Config``)."""
    return _SHARED.client(service, **options)


def default_client(service: str) -> Any:
    """The process's one client for ``service``, configured by the environment."""
    return _SHARED.default_client(service)


def forget_clients() -> None:
    """Drop the session and every client (tests that change the AWS environment call this)."""
    _SHARED.forget()


def location(client: Any) -> str:
    """Where ``client`` sends its requests, for a message: the endpoint it was given (DynamoDB
    Local, moto), or ``region <name>`` for AWS's own."""
    meta = getattr(client, "meta", None)
    endpoint = str(getattr(meta, "endpoint_url", "") or "")
    if endpoint and not endpoint.endswith(".amazonaws.com"):
        return endpoint
    return f"region {getattr(meta, 'region_name', None) or 'default'}"
