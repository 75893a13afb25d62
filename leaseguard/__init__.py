"""leaseguard: one owner per key across concurrent AWS Lambda invocations.

The public surface is what this module exports; see README.md for a guide and
``docs/`` for the design, the safety model and the benchmarks.
"""

# ``import leaseguard`` loads this module and :mod:`leaseguard.lazy`, nothing else (a Lambda
# cold start pays for the names a handler uses, when it uses them): each public name resolves
# on first use through ``__getattr__`` below, and a provider's module loads only when that
# provider is asked for. tests/test_import_cost.py pins the modules ``import leaseguard`` loads.
# Type checkers see the real imports; ``TYPE_CHECKING`` is a local constant so that ``typing``
# itself stays out.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .errors import (
        ConfigurationError,
        LeaseBackendError,
        LeaseguardError,
        LeaseLostError,
        PayloadTooLarge,
        QueueFull,
    )
    from .guard import HandoffConfig, RetryConfig, lease_owned
    from .providers import DynamoDBLeaseProvider, InMemoryLeaseProvider, RedisLeaseProvider
    from .renewal import LeaseHandle, NoActiveLease, current_lease
    from .types import Signal

__version__ = "0.1.0"

# What a handler author uses. The names for backend authors and operators live in their own
# modules (leaseguard.types, leaseguard.errors, leaseguard.contract, leaseguard.providers,
# leaseguard.handoff, leaseguard.sweeper); the ones this package exported before still resolve
# here, with a DeprecationWarning naming their module (_MOVED).
__all__ = [
    "ConfigurationError",
    "DynamoDBLeaseProvider",
    "HandoffConfig",
    "InMemoryLeaseProvider",
    "LeaseBackendError",
    "LeaseHandle",
    "LeaseLostError",
    "LeaseguardError",
    "NoActiveLease",
    "PayloadTooLarge",
    "QueueFull",
    "RedisLeaseProvider",
    "RetryConfig",
    "Signal",
    "current_lease",
    "lease_owned",
]

# Public name -> the submodule that defines it.
_EXPORTS = {
    "ConfigurationError": "errors",
    "DynamoDBLeaseProvider": "providers.dynamodb",
    "HandoffConfig": "guard",
    "InMemoryLeaseProvider": "providers.memory",
    "LeaseBackendError": "errors",
    "LeaseHandle": "renewal",
    "LeaseLostError": "errors",
    "LeaseguardError": "errors",
    "NoActiveLease": "renewal",
    "PayloadTooLarge": "errors",
    "QueueFull": "errors",
    "RedisLeaseProvider": "providers.redis",
    "RetryConfig": "guard",
    "Signal": "types",
    "current_lease": "renewal",
    "lease_owned": "guard",
}

# Exported here before 0.2, now from their own modules only.
_MOVED = {
    "DeadLetter": "types",
    "HandlerKeyError": "errors",
    "InvalidLeaseArgument": "errors",
    "KeyState": "types",
    "LeaseProvider": "types",
    "LeaseResult": "types",
    "NoopLeaseProvider": "providers",
    "SignalQueue": "types",
    "is_lease_provider": "types",
    "is_signal_queue": "types",
    "resolve_provider": "contract",
}


# Hidden from type checkers, which see the imports above: with a module __getattr__ in view,
# mypy would accept any misspelt name as an ``object``.
if not TYPE_CHECKING:
    from .lazy import module_getattr

    __getattr__ = module_getattr(__name__, _EXPORTS, globals(), moved=_MOVED)
    del module_getattr


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
