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
    from .contract import resolve_provider
    from .errors import (
        ConfigurationError,
        HandlerKeyError,
        InvalidLeaseArgument,
        LeaseBackendError,
        LeaseguardError,
        LeaseLostError,
        PayloadTooLarge,
        QueueFull,
    )
    from .guard import lease_owned
    from .providers import (
        DynamoDBLeaseProvider,
        InMemoryLeaseProvider,
        NoopLeaseProvider,
        RedisLeaseProvider,
    )
    from .renewal import LeaseHandle, NoActiveLease, current_lease
    from .types import (
        DeadLetter,
        KeyState,
        LeaseProvider,
        LeaseResult,
        Signal,
        SignalQueue,
        is_lease_provider,
        is_signal_queue,
    )

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "DeadLetter",
    "DynamoDBLeaseProvider",
    "HandlerKeyError",
    "InMemoryLeaseProvider",
    "InvalidLeaseArgument",
    "KeyState",
    "LeaseBackendError",
    "LeaseHandle",
    "LeaseLostError",
    "LeaseProvider",
    "LeaseResult",
    "LeaseguardError",
    "NoActiveLease",
    "NoopLeaseProvider",
    "PayloadTooLarge",
    "QueueFull",
    "RedisLeaseProvider",
    "Signal",
    "SignalQueue",
    "current_lease",
    "is_lease_provider",
    "is_signal_queue",
    "lease_owned",
    "resolve_provider",
]

# Public name -> the submodule that defines it.
_EXPORTS = {
    "ConfigurationError": "errors",
    "DeadLetter": "types",
    "DynamoDBLeaseProvider": "providers.dynamodb",
    "HandlerKeyError": "errors",
    "InMemoryLeaseProvider": "providers.memory",
    "InvalidLeaseArgument": "errors",
    "KeyState": "types",
    "LeaseBackendError": "errors",
    "LeaseHandle": "renewal",
    "LeaseLostError": "errors",
    "LeaseProvider": "types",
    "LeaseResult": "types",
    "LeaseguardError": "errors",
    "NoActiveLease": "renewal",
    "NoopLeaseProvider": "providers.noop",
    "PayloadTooLarge": "errors",
    "QueueFull": "errors",
    "RedisLeaseProvider": "providers.redis",
    "Signal": "types",
    "SignalQueue": "types",
    "current_lease": "renewal",
    "is_lease_provider": "types",
    "is_signal_queue": "types",
    "lease_owned": "guard",
    "resolve_provider": "contract",
}


# Hidden from type checkers, which see the imports above: with a module __getattr__ in view,
# mypy would accept any misspelt name as an ``object``.
if not TYPE_CHECKING:
    from .lazy import module_getattr

    __getattr__ = module_getattr(__name__, _EXPORTS, globals())
    del module_getattr


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
