"""Lease providers: one module per backend over one base (:mod:`.base`).

None of these modules imports its client library at import time; constructing a provider does.
Nor does this package import its modules: each name below loads its module on first use, so
``leaseguard.providers.base`` (what the guard needs) does not load the Redis and DynamoDB code.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
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

_MODULES = {
    "BaseLeaseProvider": "base",
    "DynamoDBLeaseProvider": "dynamodb",
    "InMemoryLeaseProvider": "memory",
    "NoopLeaseProvider": "noop",
    "RedisLeaseProvider": "redis",
}


# Hidden from type checkers, which see the imports above: with a module __getattr__ in view,
# mypy would accept any misspelt name as an ``object``.
if not TYPE_CHECKING:
    from leaseguard.lazy import module_getattr

    __getattr__ = module_getattr(__name__, _MODULES, globals())
    del module_getattr


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
