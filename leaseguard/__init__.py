"""leaseguard: one owner per key across concurrent AWS Lambda invocations.

The public surface is what this module exports; see README.md for a guide and
``docs/`` for the design, the safety model and the benchmarks.
"""

# ``import leaseguard`` loads this module and nothing else (a Lambda cold start pays for the
# names a handler uses, when it uses them): each public name resolves on first use through
# ``__getattr__`` below, and a provider's module loads only when that provider is asked for.
# tests/test_import_cost.py pins the modules ``import leaseguard`` loads. Type checkers see
# the real imports; ``TYPE_CHECKING`` is a local constant so that ``typing`` itself stays out.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .contract import LeaseProvider, LeaseResult, is_lease_provider, resolve_provider
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
    from .signals import DeadLetter, KeyState, Signal, SignalQueue, is_signal_queue

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
    "DeadLetter": "signals",
    "DynamoDBLeaseProvider": "providers.dynamodb",
    "HandlerKeyError": "errors",
    "InMemoryLeaseProvider": "providers.memory",
    "InvalidLeaseArgument": "errors",
    "KeyState": "signals",
    "LeaseBackendError": "errors",
    "LeaseHandle": "renewal",
    "LeaseLostError": "errors",
    "LeaseProvider": "contract",
    "LeaseResult": "contract",
    "LeaseguardError": "errors",
    "NoActiveLease": "renewal",
    "NoopLeaseProvider": "providers.noop",
    "PayloadTooLarge": "errors",
    "QueueFull": "errors",
    "RedisLeaseProvider": "providers.redis",
    "Signal": "signals",
    "SignalQueue": "signals",
    "current_lease": "renewal",
    "is_lease_provider": "contract",
    "is_signal_queue": "signals",
    "lease_owned": "guard",
    "resolve_provider": "contract",
}


def _lazy_getattr(
    package: str, exports: dict[str, str], namespace: dict[str, object]
) -> "Callable[[str], object]":
    """A module ``__getattr__`` for ``package``: each name in ``exports`` loads its module
    (relative to ``package``) on first use, then stays in ``namespace`` as a plain attribute."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(f"{package}.{module}"), name)
        namespace[name] = value  # resolved once; later lookups are plain module attributes
        return value

    return __getattr__


# Hidden from type checkers, which see the imports above: with a module __getattr__ in view,
# mypy would accept any misspelt name as an ``object``.
if not TYPE_CHECKING:
    __getattr__ = _lazy_getattr(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
