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

from aws_lambda_powertools import Logger

from leaseguard.config import DEFAULT_TTL_MS, provider_from_env
from leaseguard.handoff import InvokeDispatcher, dispatch_orphans

logger = Logger()
WORKER_FUNCTION_NAME = os.environ["WORKER_FUNCTION_NAME"]
TTL_MS = int(os.environ.get("LEASEGUARD_TTL_MS") or DEFAULT_TTL_MS)
SWEEP_LIMIT = int(os.environ.get("SWEEP_LIMIT", "100"))


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    dispatcher = InvokeDispatcher(WORKER_FUNCTION_NAME)
    sent = dispatch_orphans(provider_from_env(), dispatcher, TTL_MS, SWEEP_LIMIT)
    for envelope in sent:
        logger.info("dispatched an orphaned signal", key=envelope.key, owner=envelope.owner)
    return {"dispatched": len(sent), "keys": sorted({e.key for e in sent})}
