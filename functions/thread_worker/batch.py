"""Chat messages from an SQS queue, a batch at a time: the same threads, the same fenced log.

Each SQS record's body is ``{"threadId": ..., "text": ...}``. Powertools' batch processor calls
the record handler once per record; ``@lease_owned`` makes the record's thread one owner at a
time, keyed by ``threadId`` and identified by the record's ``messageId``. A record whose thread
is owned elsewhere is queued for that owner and counts as processed; a record whose append
fails is reported in ``batchItemFailures``, so SQS delivers it again.

When an owner has to hand the rest of its thread's queue to a new invocation, that invocation's
event is a handoff envelope sent by async ``Invoke`` of this function, not an SQS batch:
``@handle_envelopes`` turns it into a one-record batch for the same processor (and gives the
record handler this invocation's context, its deadline and function ARN).
"""

from __future__ import annotations

from typing import Any

from app import PROVIDER, append, text_of, thread_of, tracer
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from leaseguard import current_lease, lease_owned
from leaseguard.batch import handle_envelopes

logger = Logger()
processor = BatchProcessor(event_type=EventType.SQS)


# No tracer= here: a batch's records share the handler's one subsegment, where each record's
# lease annotations would overwrite the one before.
@lease_owned(lambda record: thread_of(record.raw_event), provider=PROVIDER, logger=logger)
def record_handler(record: SQSRecord) -> bool:
    lease = current_lease()
    lease.check()  # stop before writing if the lease was lost
    # The run's signal id is the record's messageId (a forwarded message run here: its own
    # id), so an SQS redelivery of a record that was appended is skipped.
    appended = append(lease.key, lease.owner, text_of(record.raw_event), lease.token or 0)
    logger.info(
        "thread updated from SQS",
        extra={"threadId": lease.key, "messageId": lease.owner, "token": lease.token},
    )
    return appended


@tracer.capture_lambda_handler
@handle_envelopes
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return process_partial_response(event, record_handler, processor, context)
