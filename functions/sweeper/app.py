"""The sweeper, every minute: signals queued behind an owner that died are never stranded.

When an owner dies (a crash, a timeout) its own event and those queued behind it stay in the
lease backend, and so does a failed message waiting out its retry delay. The next event for
that thread would run them, but a thread may get no next event. So once a minute this function
adopts every key whose owner's lease expired with work pending (the oldest pending message
becomes the owner, with a new fencing token) and sends each grant to the thread worker
(``LEASEGUARD_WORKER_FUNCTION``) by async invoke, which claims it and runs the message. Each
adopted key counts ``OrphanAdopted`` and ``OldestQueuedAgeMs`` (the queued-age alarm).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer

from leaseguard.sweeper import sweeper_handler

logger = Logger()
tracer = Tracer()  # Tracing: Active in template.yaml; off outside Lambda and under sam local
# Built in the init phase: the backend's client, the Lambda client, the settings checked.
sweep = sweeper_handler()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    result = sweep(event, context)
    logger.info("sweeper pass", dispatched=result["dispatched"], keys=result["keys"])
    return result
