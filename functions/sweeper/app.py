"""The sweeper, every minute: signals queued behind an owner that died are never stranded.

When an owner dies (a crash, a timeout) its own event and those queued behind it stay in the
lease backend. The next event for that thread would run them first, but a thread may get no
next event. So once a minute this function adopts every key whose owner's lease expired with
work pending (the oldest pending message becomes the owner, with a new fencing token) and sends
each grant to the thread worker by async invoke, which claims it and runs the message.
"""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools import Logger, Tracer

from leaseguard.config import DEFAULT_TTL_MS, provider_from_env
from leaseguard.handoff import InvokeDispatcher, dispatch_orphans

logger = Logger()
tracer = Tracer()  # Tracing: Active in template.yaml; off outside Lambda and under sam local
WORKER_FUNCTION_NAME = os.environ["WORKER_FUNCTION_NAME"]
TTL_MS = int(os.environ.get("LEASEGUARD_TTL_MS") or DEFAULT_TTL_MS)
SWEEP_LIMIT = int(os.environ.get("SWEEP_LIMIT", "100"))
# Both clients built in the init phase, not in the first pass (as in the worker): the lease
# backend's into provider_from_env's cache, whose every later call in this environment (one per
# pass) answers the same provider, or the one a test put in its place (use_provider).
if os.environ.get("LEASEGUARD_BACKEND"):
    provider_from_env()
dispatcher = InvokeDispatcher(WORKER_FUNCTION_NAME)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    # Each adopted key: OrphanAdopted and OldestQueuedAgeMs (the queued-age alarm).
    sent = dispatch_orphans(provider_from_env(), dispatcher, TTL_MS, SWEEP_LIMIT)
    for envelope in sent:
        logger.info("dispatched an orphaned signal", key=envelope.key, owner=envelope.owner)
    return {"dispatched": len(sent), "keys": sorted({e.key for e in sent})}
