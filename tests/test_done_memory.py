"""The completed-id memory past its bound, on memory, Redis and Redis Cluster (DynamoDB:
``tests/test_dynamodb_bounds.py``): issue 23, finding 4.

The memory keeps at most DONE_LIMIT ids per key (the oldest forgotten first) for at most
DEDUPE_WINDOW_MS. These tests pin what the README, docs/safety.md and invariants (d) / (f) of
docs/protocol.md now say happens past DONE_LIMIT completions inside the window: a resent or
redelivered forward of a forgotten id runs again; the oldest id still remembered is a
duplicate; a resent hand-off or release of a forgotten owner is recognised only while it is
the key's last hand-off (``p``/``pt``) or its entry is still remembered, and is reported lost
once DONE_LIMIT later completions (by later owners) came before it.
"""

from __future__ import annotations

import pytest

from leaseguard import Signal
from leaseguard.errors import LeaseLostError
from leaseguard.protocol.model import DONE_LIMIT
from leaseguard.providers.base import BaseLeaseProvider

from .conftest import ProviderFactory

TTL = 60_000
KEY = "memory:{1}"


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def provider(request: pytest.FixtureRequest, make_provider: ProviderFactory) -> BaseLeaseProvider:
    return make_provider(str(request.param))()


def run_alone(provider: BaseLeaseProvider, sid: str) -> int:
    granted = provider.acquire_or_enqueue(KEY, Signal(sid, {}), TTL)
    assert granted.acquired and granted.owner == sid and granted.token is not None
    assert provider.transfer_to_next(KEY, sid, TTL, token=granted.token) is None
    return granted.token


def test_past_done_limit_the_oldest_ids_are_forgotten_first(provider: BaseLeaseProvider) -> None:
    ids = [f"e{n}" for n in range(DONE_LIMIT + 1)]
    tokens = [run_alone(provider, sid) for sid in ids]
    first_token = tokens[0]
    # ids[0]'s release, resent after DONE_LIMIT later completions: neither p/pt (later owners
    # finished) nor the done memory (it was forgotten first) knows it: reported lost
    with pytest.raises(LeaseLostError):
        provider.transfer_to_next(KEY, ids[0], TTL, token=first_token)
    # the last owner's resend is recognised (p/pt, and its entry is the newest)
    last = ids[-1]
    assert provider.transfer_to_next(KEY, last, TTL, token=tokens[-1]) is None
    # the oldest still remembered (ids[1]) is a duplicate; ids[0] was forgotten: it runs again
    duplicate = provider.acquire_or_enqueue(KEY, Signal(ids[1], {}), TTL)
    assert (duplicate.acquired, duplicate.owner, duplicate.position) == (False, None, None)
    again = provider.acquire_or_enqueue(KEY, Signal(ids[0], {}), TTL)
    assert again.acquired and again.owner == ids[0] and again.token != first_token
    assert provider.transfer_to_next(KEY, ids[0], TTL, token=again.token) is None
