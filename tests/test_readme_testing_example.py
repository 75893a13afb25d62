import pytest

from leaseguard import current_lease, lease_owned
from leaseguard.testing import LambdaContext, use_provider


@lease_owned(key_fn="threadId")
def handler(event, context):
    return {"thread": event["threadId"], "token": current_lease().token}


@pytest.mark.parametrize(
    "backend", ["leaseguard_memory_provider", "leaseguard_redis", "leaseguard_dynamodb_table"]
)
def test_a_busy_thread_queues_the_event_for_its_owner(backend, request, lambda_context):
    provider = request.getfixturevalue(backend)  # a fresh provider of that backend
    with use_provider(provider):  # every guarded handler runs on it until the block ends
        assert handler({"threadId": "t-1"}, lambda_context)["thread"] == "t-1"
        provider.acquire_lease("t-1", "another-invocation", 15_000)
        # A new request id: the same one again would be a redelivery ("duplicate").
        answer = handler({"threadId": "t-1"}, LambdaContext(function_arn=""))
    assert answer["leaseguard"]["status"] == "forwarded"
    assert provider.pending_signals("t-1") == 1  # waiting for its owner
