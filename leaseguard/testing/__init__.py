"""Helpers for testing code that uses leaseguard: real servers and a Lambda-like context.

``leaseguard.testing.servers`` starts real Redis servers (standalone, a primary with replicas,
or Cluster) on free ports; :class:`DynamoDBServer` serves moto's DynamoDB on a free port, one
request at a time; :class:`LambdaContext` stands in for the context object Lambda passes to a
handler; :func:`use_provider` points every guarded handler at a provider for a test, and back.
:mod:`leaseguard.testing.pytest_plugin` (a pytest plugin, registered by installing
``leaseguard[testing]``) gives them as fixtures. docs/testing.md shows how.
"""

from typing import TYPE_CHECKING, Any

from .context import LambdaContext
from .providers import use_provider
from .replicas import RedisClusterWithReplicas, RedisReplica, RedisReplicatedServers
from .servers import RedisClusterServers, RedisServer, find_redis_server, free_port

if TYPE_CHECKING:
    from .dynamodb_server import DynamoDBServer


def __getattr__(name: str) -> Any:
    # Imported on first use: `python -m leaseguard.testing.dynamodb_server` must not find its
    # module already loaded, and Redis-only users never import moto's server.
    if name == "DynamoDBServer":
        from .dynamodb_server import DynamoDBServer

        return DynamoDBServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DynamoDBServer",
    "LambdaContext",
    "RedisClusterServers",
    "RedisClusterWithReplicas",
    "RedisReplica",
    "RedisReplicatedServers",
    "RedisServer",
    "find_redis_server",
    "free_port",
    "use_provider",
]
