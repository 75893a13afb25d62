"""``@lease_owned``: one invocation at a time owns a key; the others forward their events to it.

For each invocation::

    key = key_fn(event)
    acquire_or_enqueue(key, Signal(request id, event))
      ├─ queued  → return "forwarded" (HTTP 202 for API Gateway); the handler does not run
      └─ owner   → renew every ttl/3 on a thread ─ run handler ─ pause the renewals
                   └─ transfer_to_next: the next queued signal becomes owner, no gap
                        ├─ time left  → run it inline, same invocation (and repeat),
                        │               unless the own event's caller waits (API Gateway)
                        ├─ no time    → async Invoke of this function, or SQS, with an envelope
                        └─ queue empty → the key is released
    the renewal thread is joined before the invocation returns, however it ends

The flow lives in one generator (:meth:`.flow.Invocation.flow`) that *yields* each handler
run to a driver; the sync and the async wrappers are two drivers of the same flow, so
``async def`` handlers get exactly the same semantics.

The parts: :mod:`.options` (the decorator's settings), :mod:`.handler` (one guarded handler:
key function, provider, policy), :mod:`.call` (how the handler was called), :mod:`.flow` (the
steps above), :mod:`.policy` (inline or hand off), :mod:`.failures` (failed runs and dead
letters), :mod:`.lost` (a lease lost under the flow), :mod:`.responses` (what the event source
gets back, and its :class:`Status` words), :mod:`.drivers` (sync and async), :mod:`.tracebacks`
(the guard's frames out of the handler's exceptions) and :mod:`.decorator`.
"""

from leaseguard.types import QueueProvider

from .decorator import lease_owned
from .failures import UnfinishedRuns
from .handler import GuardedHandler
from .options import (
    DEFAULT_HANDOFF_MARGIN_MS,
    HANDOFF_MODES,
    GuardOptions,
    Handoff,
    HandoffConfig,
    RetryConfig,
)
from .policy import HandoffPolicy
from .responses import Status

__all__ = [
    "DEFAULT_HANDOFF_MARGIN_MS",
    "HANDOFF_MODES",
    "GuardOptions",
    "GuardedHandler",
    "Handoff",
    "HandoffConfig",
    "HandoffPolicy",
    "QueueProvider",
    "RetryConfig",
    "Status",
    "UnfinishedRuns",
    "lease_owned",
]
