"""Helpers for testing code that uses leaseguard: real servers and a Lambda-like context.

``leaseguard.testing.servers`` starts real Redis servers (standalone or Cluster) on free
ports; :class:`LambdaContext` stands in for the context object Lambda passes to a handler.
"""

from .context import LambdaContext
from .servers import RedisClusterServers, RedisServer, find_redis_server, free_port

__all__ = ["LambdaContext", "RedisClusterServers", "RedisServer", "find_redis_server", "free_port"]
