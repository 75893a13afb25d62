"""leaseguard: one owner per key across concurrent AWS Lambda invocations.

The public surface is what this module exports; see README.md for a guide and
``docs/`` for the design, the safety model and the benchmarks.
"""

from .contract import LeaseProvider, LeaseResult, is_lease_provider, resolve_provider
from .errors import (
    ConfigurationError,
    HandlerKeyError,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseguardError,
    LeaseLostError,
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
    "RedisLeaseProvider",
    "Signal",
    "SignalQueue",
    "current_lease",
    "is_lease_provider",
    "is_signal_queue",
    "lease_owned",
    "resolve_provider",
]
