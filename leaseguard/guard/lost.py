"""A lease lost while the flow held it: what the log says and the user's ``on_lost`` hears."""

from __future__ import annotations

import logging
from collections.abc import Callable

from leaseguard.errors import LeaseLostError
from leaseguard.observability import Telemetry
from leaseguard.renewal import LeaseHandle
from leaseguard.types import QueueProvider


def lost_before_handoff(
    telemetry: Telemetry, handle: LeaseHandle, lost: LeaseLostError, provider: QueueProvider
) -> None:
    """The hand-off found the lease held by someone else, or by no one: nothing is handed off."""
    # No holder at all: the lease expired, or the backend lost it (a Redis restart without
    # persistence), and then whatever was queued behind it went too.
    vanished = " (the key has no owner: expired, or lost by the backend)"
    handle._mark_lost(
        "the lease expired or moved before the handoff" + ("" if lost.holder else vanished)
    )
    telemetry.count("LeaseLost")
    telemetry.log(
        logging.ERROR,
        "lease lost before the handoff; not handing off",
        lease_key=handle.key,
        lease_owner=handle.owner,
        lease_holder=lost.holder,
        pending_signals=_pending_or_none(provider, handle.key),
    )


def lost_callback(
    telemetry: Telemetry,
    on_lost: Callable[[LeaseHandle], None] | None,
    handle: LeaseHandle,
) -> None:
    """A handle's ``on_lost``: logged, then the user's callback, if any."""
    telemetry.log(
        logging.WARNING,
        "lease lost",
        lease_key=handle.key,
        lease_owner=handle.owner,
        reason=handle.lost_reason,
    )
    if on_lost is not None:
        on_lost(handle)


def _pending_or_none(provider: QueueProvider, key: str) -> int | None:
    """How many signals still wait on ``key``, for a log line (``None`` if the backend cannot
    say): after a lost lease it tells an operator whether work was left behind or lost."""
    try:
        return provider.pending_signals(key)
    except Exception:
        return None
