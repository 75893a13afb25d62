"""The sweeper: a scheduled Lambda function that re-delivers what dead owners left behind.

An owner that dies (a crash, a timeout) leaves its events stored on its key; so does a failed
event waiting out its retry delay with no envelope on the way (:mod:`leaseguard.guard.retries`).
The key's next event runs them first, but a key may get no next event. A sweeper pass adopts
every key whose lease ran out with work pending (row D of docs/protocol.md: the head signal is
granted the key, with a new fencing token) and sends each grant to the guarded function, which
claims it and runs the event. Schedule it every minute::

    # functions/sweeper/app.py
    from leaseguard.sweeper import sweeper_handler

    handler = sweeper_handler()  # LEASEGUARD_WORKER_FUNCTION or LEASEGUARD_HANDOFF_QUEUE_URL

A pass that finds nothing costs one query per orphan-index shard (DynamoDB) or one script per
Redis primary. A grant whose envelope is lost or late is not lost: it runs out unclaimed,
charged nothing, and the next pass adopts it again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from leaseguard.config import DEFAULT_TTL_MS, env_int, provider_from_env
from leaseguard.errors import ConfigurationError
from leaseguard.handoff import (
    Dispatcher,
    Envelope,
    InvokeDispatcher,
    SqsDispatcher,
    dispatch_orphans,
)
from leaseguard.validation import check_positive_int, check_ttl

__all__ = ["DEFAULT_SWEEP_LIMIT", "sweep", "sweeper_handler"]

DEFAULT_SWEEP_LIMIT = 100  # keys one pass adopts; the next pass takes the rest
_log = logging.getLogger("leaseguard")


def sweep(
    provider: Any = None,
    dispatcher: Dispatcher | None = None,
    *,
    worker_function: str | None = None,
    queue_url: str | None = None,
    ttl_ms: int | None = None,
    limit: int = DEFAULT_SWEEP_LIMIT,
    metrics: Any = None,
) -> list[Envelope]:
    """One sweeper pass: the envelopes it sent, one per adopted key.

    Parameters
    ----------
    provider
        The lease backend; default: the one the ``LEASEGUARD_*`` environment describes.
    dispatcher
        Where adopted grants go; default: an SQS queue (``queue_url``) or an async ``Invoke``
        of ``worker_function``, the guarded function that runs them.
    worker_function, queue_url
        Default ``LEASEGUARD_WORKER_FUNCTION``, ``LEASEGUARD_HANDOFF_QUEUE_URL``; one is needed
        when ``dispatcher`` is not given (the queue wins when both are set).
    ttl_ms
        The TTL of each adoption's grant: the worker's own (default ``LEASEGUARD_TTL_MS`` or
        15 s), so that its claim finds the grant alive.
    limit
        Most keys adopted in this pass.
    metrics
        A Powertools ``Metrics`` for ``OrphanAdopted`` and ``OldestQueuedAgeMs`` per adopted key
        (default: metrics of the pass's own when ``POWERTOOLS_METRICS_NAMESPACE`` is set), the
        numbers a stuck key's alarm watches (:func:`~leaseguard.handoff.dispatch_orphans`).
    """
    target = dispatcher or _dispatcher(worker_function, queue_url)
    ttl = check_ttl(ttl_ms if ttl_ms is not None else env_int("LEASEGUARD_TTL_MS", DEFAULT_TTL_MS))
    limit = check_positive_int("limit", limit, 10_000)
    backend = provider if provider is not None else provider_from_env()
    return dispatch_orphans(backend, target, ttl, limit, metrics=metrics)


def sweeper_handler(
    provider: Any = None,
    *,
    worker_function: str | None = None,
    queue_url: str | None = None,
    ttl_ms: int | None = None,
    limit: int | None = None,
    metrics: Any = None,
) -> Callable[[Any, Any], dict[str, Any]]:
    """A Lambda handler that runs one :func:`sweep` per invocation (schedule it every minute).

    The settings are :func:`sweep`'s, checked now, at init (the dispatcher's client is built
    now too, and the provider when the environment names a backend), so that a misconfigured sweeper
    fails its first deployment test rather than its first orphan; ``limit`` defaults to
    ``LEASEGUARD_SWEEP_LIMIT`` or 100. It answers ``{"dispatched": n, "keys": [...]}`` and logs
    each adopted key.
    """
    dispatcher = _dispatcher(worker_function, queue_url)
    if provider is None and os.environ.get("LEASEGUARD_BACKEND"):
        provider_from_env()  # built in the init phase; each pass looks it up (use_provider)
    count = limit if limit is not None else env_int("LEASEGUARD_SWEEP_LIMIT", DEFAULT_SWEEP_LIMIT)
    check_positive_int("limit", count, 10_000)
    if ttl_ms is not None:
        check_ttl(ttl_ms)

    def handler(event: Any, context: Any) -> dict[str, Any]:
        sent = sweep(provider, dispatcher, ttl_ms=ttl_ms, limit=count, metrics=metrics)
        for envelope in sent:
            _log.info(
                "dispatched an orphaned signal",
                extra={"lease_key": envelope.key, "signal_id": envelope.owner},
            )
        return {"dispatched": len(sent), "keys": sorted({envelope.key for envelope in sent})}

    return handler


def _dispatcher(worker_function: str | None, queue_url: str | None) -> Dispatcher:
    url = queue_url or os.environ.get("LEASEGUARD_HANDOFF_QUEUE_URL") or None
    if url:
        return SqsDispatcher(url)
    function = worker_function or os.environ.get("LEASEGUARD_WORKER_FUNCTION") or None
    if function:
        return InvokeDispatcher(function)
    raise ConfigurationError(
        "the sweeper needs somewhere to send adopted grants: pass worker_function= (the guarded "
        "function, by async Invoke) or queue_url= (its SQS queue), or set "
        "LEASEGUARD_WORKER_FUNCTION or LEASEGUARD_HANDOFF_QUEUE_URL"
    )
