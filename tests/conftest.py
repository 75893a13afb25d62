"""Shared fixtures: real servers started once per session, and providers per backend.

``REDIS_URL`` points the standalone tests at an existing server instead of starting one.
Every provider a test gets uses a fresh key prefix (or table), so tests never see each
other's keys.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import moto  # noqa: F401  (first: see below)
import pytest
import redis
from redis.cluster import RedisCluster

from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.providers.memory import InMemoryLeaseProvider
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import DynamoDBServer, RedisClusterServers, RedisServer

ProviderFactory = Callable[[str], Callable[..., BaseLeaseProvider]]

# Importing moto adds its request interceptor to botocore's built-in handlers, which a boto3
# session copies when it is created. The DynamoDB provider shares one session per process, so
# moto must be imported before any test builds a provider against a DynamoDBServer; otherwise a
# later in-process mock_aws() test would find a session without the interceptor and call AWS.


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    explicit = os.environ.get("REDIS_URL")
    if explicit:
        yield explicit
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    with RedisClusterServers(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: RedisClusterServers) -> str:
    return redis_cluster.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def make_provider(request: pytest.FixtureRequest) -> Iterator[ProviderFactory]:
    """``make_provider(backend)`` -> a factory of providers that share one fresh namespace on
    that backend (call it twice to get two clients of the same keys)."""
    made: list[Callable[[], None]] = []

    def factory(backend: str) -> Callable[..., BaseLeaseProvider]:
        if backend == "memory":
            instances: list[InMemoryLeaseProvider] = []

            def memory_provider(**options: object) -> BaseLeaseProvider:
                if not instances:  # one process: "another client" is the same object
                    instances.append(InMemoryLeaseProvider(**options))  # type: ignore[arg-type]
                return instances[0]

            return memory_provider
        if backend == "redis":
            url = request.getfixturevalue("redis_url")
            prefix = _unique_prefix()

            def redis_provider(**options: object) -> BaseLeaseProvider:
                client = redis.Redis.from_url(url)
                made.append(client.close)
                return RedisLeaseProvider(client, prefix=prefix, **options)  # type: ignore[arg-type]

            return redis_provider
        if backend == "redis-cluster":
            url = request.getfixturevalue("redis_cluster_url")
            prefix = _unique_prefix()

            def cluster_provider(**options: object) -> BaseLeaseProvider:
                client = RedisCluster.from_url(url)
                made.append(client.close)
                return RedisLeaseProvider(client, prefix=prefix, **options)  # type: ignore[arg-type]

            return cluster_provider
        if backend == "dynamodb":
            return _dynamodb_factory(request, made)
        raise ValueError(f"unknown backend {backend!r}")

    yield factory
    for close in made:
        close()


def _dynamodb_factory(
    request: pytest.FixtureRequest, made: list[Callable[[], None]]
) -> Callable[..., BaseLeaseProvider]:
    """Providers on a fresh table of moto's in-process DynamoDB (moto nests its mocks, so each
    factory starts one and the data lives until the test ends). clock_skew_ms defaults to 0
    because every client here reads the same clock; the skew margin has its own tests."""
    from moto import mock_aws

    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

    monkeypatch = request.getfixturevalue("monkeypatch")
    for name, value in _FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    mock = mock_aws()
    mock.start()
    made.append(mock.stop)
    table = f"lg-{uuid.uuid4().hex[:12]}"
    DynamoDBLeaseProvider(table, region_name="us-east-1").create_table()

    clock = MovableClock()
    # moto's in-process backend is not safe for two threads at once (a renewal on the renewer's
    # thread while the handler's thread takes or hands off: a request can fail, or both pass
    # a condition), while DynamoDB applies each request to an item atomically. One lock per
    # test around every request of its providers makes moto do the same.
    one_at_a_time = threading.RLock()

    def dynamodb_provider(**options: object) -> BaseLeaseProvider:
        options.setdefault("clock_skew_ms", 0)
        options.setdefault("clock", clock)
        provider = DynamoDBLeaseProvider(table, region_name="us-east-1", **options)  # type: ignore[arg-type]
        provider.test_clock = clock  # type: ignore[attr-defined]
        send = provider.client._make_api_call

        def serialized(operation: str, params: dict[str, Any]) -> Any:
            with one_at_a_time:
                return send(operation, params)

        provider.client._make_api_call = serialized  # type: ignore[method-assign]
        return provider

    return dynamodb_provider


class MovableClock:
    """Wall-clock milliseconds that a test can move forward: on DynamoDB (callers' clocks) time
    can pass without sleeping, and past every deadline, including the orphan index's."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


def let_leases_expire(provider: object, *leases: tuple[str, str]) -> None:
    """The owners of these leases died: their leases run out now, however long the setup took
    (a short TTL given at setup would race the setup itself)."""
    for key, owner in leases:
        assert provider.renew_lease(key, owner, 1)  # type: ignore[attr-defined]
    clock = getattr(provider, "test_clock", None)
    if clock is not None:
        clock.offset_ms += 60_000  # also past the deadline the orphan index was written with
    time.sleep(0.02)


_FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def fake_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and a region for boto3 clients under moto (never real AWS)."""
    for name, value in _FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def dynamodb_server() -> Iterator[DynamoDBServer]:
    """moto's DynamoDB over real HTTP, one request at a time (so botocore's retries, request
    counts and multi-process races all behave as against the service)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in _FAKE_AWS_ENV.items():
            patch.setenv(name, value)  # worker processes inherit it
        with DynamoDBServer() as running:
            yield running


@pytest.fixture(scope="session")
def dynamodb_endpoint(dynamodb_server: DynamoDBServer) -> str:
    return dynamodb_server.endpoint_url


@pytest.fixture
def dynamodb_table(dynamodb_server: DynamoDBServer) -> str:
    name = f"lg-{uuid.uuid4().hex[:12]}"
    DynamoDBLeaseProvider(
        name, endpoint_url=dynamodb_server.endpoint_url, region_name="us-east-1"
    ).create_table()
    return name


@pytest.fixture
def make_dynamodb(
    dynamodb_server: DynamoDBServer, dynamodb_table: str
) -> Callable[..., DynamoDBLeaseProvider]:
    """Providers on one fresh table of :func:`dynamodb_server`."""

    def build(**options: Any) -> DynamoDBLeaseProvider:
        return DynamoDBLeaseProvider(
            dynamodb_table,
            endpoint_url=dynamodb_server.endpoint_url,
            region_name="us-east-1",
            **options,
        )

    return build


@pytest.fixture(params=["memory", "redis", "redis-cluster", "dynamodb"])
def lease_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def provider(make_provider: ProviderFactory, lease_backend: str) -> BaseLeaseProvider:
    return make_provider(lease_backend)()
