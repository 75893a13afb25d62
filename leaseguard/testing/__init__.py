"""Helpers for testing code that uses leaseguard: real servers and a Lambda-like context.

``leaseguard.testing.servers`` starts real Redis servers (standalone or Cluster) on free
ports; :class:`DynamoDBServer` serves moto's DynamoDB on a free port, one request at a time;
:class:`LambdaContext` stands in for the context object Lambda passes to a handler.
"""

from .context import LambdaContext
from .dynamodb_server import DynamoDBServer
from .servers import RedisClusterServers, RedisServer, find_redis_server, free_port

__all__ = [
    "DynamoDBServer",
    "LambdaContext",
    "RedisClusterServers",
    "RedisServer",
    "find_redis_server",
    "free_port",
]
