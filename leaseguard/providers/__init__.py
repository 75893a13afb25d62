"""Lease providers: one module per backend over one base (:mod:`.base`).

None of these modules imports its client library at import time; constructing a provider does.
"""

from .base import BaseLeaseProvider
from .dynamodb import DynamoDBLeaseProvider
from .memory import InMemoryLeaseProvider
from .noop import NoopLeaseProvider
from .redis import RedisLeaseProvider

__all__ = [
    "BaseLeaseProvider",
    "DynamoDBLeaseProvider",
    "InMemoryLeaseProvider",
    "NoopLeaseProvider",
    "RedisLeaseProvider",
]
