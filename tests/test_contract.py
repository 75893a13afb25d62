"""The lease contract, run unchanged against every backend (``lease_backend`` fixture).

Expiry cases wait past a short TTL; nothing here asserts how fast anything is.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from leaseguard.contract import resolve_provider
from leaseguard.errors import InvalidLeaseArgument
from leaseguard.providers import NoopLeaseProvider
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.types import LeaseResult, is_lease_provider

KEY = "thread:{42}\n ü"
TTL = 5_000
SHORT = 150  # ms; tests that need expiry sleep past it
T = TypeVar("T")


def expire() -> None:
    time.sleep(SHORT / 1000 + 0.15)


def state(provider: BaseLeaseProvider, key: str = KEY) -> tuple[Any, ...]:
    s = provider.inspect_key(key)
    return (s.owner, s.token, s.queued, s.in_flight)


def test_fresh_acquire(provider: BaseLeaseProvider) -> None:
    result = provider.acquire_lease(KEY, "a", TTL)
    assert result.acquired and result.owner == "a"
    assert isinstance(result.token, int) and result.token > 0
    assert provider.get_lease_owner(KEY) == "a"


class Round:
    """One try of a check whose answers are certain only while its calls land inside a TTL.

    A provider's deadline lies between the start and the end of the call that set it, so the
    check knows from its own clock whether a later call certainly came before that deadline
    (``inside``) or certainly after it (``sleep_past``). A loaded machine (moto took over
    400 ms a call in CI) can leave a round undecided; the next one tries again on a fresh key
    with twice the TTL. Nothing here asserts how fast anything is."""

    def __init__(self, key: str, ttl_ms: int) -> None:
        self.key, self.ttl_ms, self.ttl = key, ttl_ms, ttl_ms / 1000
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}

    def call(self, name: str, call: Callable[..., T], *args: Any) -> T:
        self.started[name] = time.monotonic()
        try:
            return call(*args)
        finally:
            self.ended[name] = time.monotonic()

    def inside(self, name: str) -> bool:
        """Whether now is certainly before the deadline the call ``name`` set."""
        return time.monotonic() - self.started[name] < self.ttl

    def sleep_half(self) -> None:
        time.sleep(self.ttl / 2)

    def sleep_past(self, name: str) -> None:
        """Until certainly past the deadline the call ``name`` set."""
        time.sleep(max(0.0, self.ended[name] + self.ttl + 0.05 - time.monotonic()))


def ttl_rounds() -> Iterator[Round]:
    for ttl_ms in (1_000, 2_000, 4_000, 8_000, 16_000):
        yield Round(f"{KEY}/{ttl_ms}", ttl_ms)
    pytest.fail("five rounds undecided: the calls took longer than the TTLs allow")


def extended(
    provider: BaseLeaseProvider,
    extend: Callable[[str, int], T],
    after: Callable[[str], Any] = lambda key: None,
) -> tuple[str, LeaseResult, T, str | None, Any]:
    """``a`` acquires a key; half a TTL later ``extend(key, ttl_ms)``; past the first TTL
    (inside the second) the owner is read and ``after(key)`` called. Returns the key, the
    acquire's result, what ``extend`` returned, the owner and what ``after`` returned, from the
    first round whose answers are certain (see :class:`Round`)."""
    for r in ttl_rounds():
        first = r.call("first", provider.acquire_lease, r.key, "a", r.ttl_ms)
        r.sleep_half()
        second = r.call("second", extend, r.key, r.ttl_ms)
        if not r.inside("first"):
            continue  # the first lease may have run out before the second call
        r.sleep_past("first")
        owner, then = provider.get_lease_owner(r.key), after(r.key)
        if r.inside("second"):
            return r.key, first, second, owner, then
    raise AssertionError("unreachable: ttl_rounds fails the test first")


def test_same_owner_reacquire_refreshes_ttl_and_keeps_token(provider: BaseLeaseProvider) -> None:
    _, first, again, owner, _ = extended(
        provider, lambda key, ttl: provider.acquire_lease(key, "a", ttl)
    )
    assert first.acquired
    assert again == LeaseResult(True, "a", first.token)
    assert owner == "a"  # past the first TTL, inside the refreshed one


def test_other_owner_is_refused_and_told_the_holder(provider: BaseLeaseProvider) -> None:
    held = provider.acquire_lease(KEY, "a", TTL)
    refused = provider.acquire_lease(KEY, "b", TTL)
    assert refused == LeaseResult(False, "a", held.token)
    assert provider.get_lease_owner(KEY) == "a"


def test_expiry_frees_the_key(provider: BaseLeaseProvider) -> None:
    first = provider.acquire_lease(KEY, "a", SHORT)
    expire()
    assert provider.get_lease_owner(KEY) is None
    taken = provider.acquire_lease(KEY, "b", TTL)
    assert taken.acquired and taken.owner == "b"
    assert taken.token is not None and first.token is not None and taken.token > first.token


def test_release_by_non_owner_does_nothing(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "a", TTL)
    before = state(provider)
    provider.release_lease(KEY, "b")
    assert state(provider) == before
    assert provider.get_lease_owner(KEY) == "a"


def test_release_by_owner_frees(provider: BaseLeaseProvider) -> None:
    first = provider.acquire_lease(KEY, "a", TTL)
    provider.release_lease(KEY, "a")
    assert provider.get_lease_owner(KEY) is None
    second = provider.acquire_lease(KEY, "b", TTL)
    assert second.acquired
    assert second.token is not None and first.token is not None and second.token > first.token


def test_release_of_free_key_is_harmless(provider: BaseLeaseProvider) -> None:
    provider.release_lease(KEY, "a")
    assert provider.get_lease_owner(KEY) is None


def test_renew_extends(provider: BaseLeaseProvider) -> None:
    key, held, renewed, owner, _ = extended(
        provider, lambda key, ttl: provider.renew_lease(key, "a", ttl)
    )
    assert renewed is True
    assert owner == "a"  # past the first TTL, inside the renewed one
    assert provider.inspect_key(key).token == held.token


def test_renew_by_non_owner_is_refused(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "a", TTL)
    assert provider.renew_lease(KEY, "b", TTL) is False
    assert provider.get_lease_owner(KEY) == "a"


def test_renew_after_expiry_fails_and_does_not_resurrect(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "a", SHORT)
    expire()
    assert provider.renew_lease(KEY, "a", TTL) is False
    assert provider.get_lease_owner(KEY) is None


def test_transfer_by_non_holder_returns_false(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "a", TTL)
    before = state(provider)
    assert provider.transfer_lease(KEY, "b", "c", TTL) is False
    assert state(provider) == before


def test_transfer_of_free_key_returns_false(provider: BaseLeaseProvider) -> None:
    assert provider.transfer_lease(KEY, "a", "b", TTL) is False
    assert provider.get_lease_owner(KEY) is None


def test_transfer_moves_owner_refreshes_ttl_and_raises_token(provider: BaseLeaseProvider) -> None:
    key, first, moved, owner, taken = extended(
        provider,
        lambda key, ttl: provider.transfer_lease(key, "a", "b", ttl),
        after=lambda key: provider.acquire_lease(key, "a", TTL),
    )
    assert moved is True
    assert owner == "b"  # past a's original deadline
    assert taken.acquired is False
    after = provider.inspect_key(key)
    assert after.token is not None and first.token is not None and after.token > first.token


def test_atomic_transfer_is_declared(provider: BaseLeaseProvider) -> None:
    assert type(provider).atomic_transfer is True


# DynamoDB runs on moto in this process (~3 requests a grant at ~8 ms each): make test takes 250
# grants there, make soak the full 1,000 (LEASEGUARD_DYNAMODB_GRANTS=1000).
DYNAMODB_GRANTS = int(os.environ.get("LEASEGUARD_DYNAMODB_GRANTS", "250"))


def test_tokens_strictly_increase_over_1000_grants(provider: BaseLeaseProvider) -> None:
    grants = DYNAMODB_GRANTS if isinstance(provider, DynamoDBLeaseProvider) else 1000
    rng = random.Random(7)
    key = f"tokens-{uuid.uuid4().hex}"
    tokens: list[int] = []
    owner = "o0"
    first = provider.acquire_lease(key, owner, TTL)
    assert first.token is not None
    tokens.append(first.token)
    for i in range(1, grants):
        new = f"o{i}"
        roll = rng.random()
        if roll < 0.45:
            assert provider.transfer_lease(key, owner, new, TTL)
        elif roll < 0.9:
            provider.release_lease(key, owner)
            assert provider.acquire_lease(key, new, TTL).acquired
        else:
            provider.renew_lease(key, owner, 1)  # shrink the lease and let it expire
            time.sleep(0.005)
            assert provider.acquire_lease(key, new, TTL).acquired
        owner = new
        token = provider.inspect_key(key).token
        assert token is not None
        tokens.append(token)
    assert all(b > a for a, b in itertools.pairwise(tokens)), "token went backwards"
    assert len(set(tokens)) == grants


# -- structural detection and the no-op fallback -----------------------------------------------


class _FiveMethods:
    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return LeaseResult(True, owner, 1)

    def get_lease_owner(self, key: str) -> str | None:
        return None

    def release_lease(self, key: str, owner: str) -> None:
        return None

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return True

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return True


class _FourMethods:
    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return LeaseResult(True, owner, 1)

    def get_lease_owner(self, key: str) -> str | None:
        return None

    def release_lease(self, key: str, owner: str) -> None:
        return None

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return True


class _NotCallable(_FourMethods):
    transfer_lease = "not a method"


def test_is_lease_provider_is_structural(provider: BaseLeaseProvider) -> None:
    assert is_lease_provider(provider)
    assert is_lease_provider(_FiveMethods())
    assert not is_lease_provider(_FourMethods())
    assert not is_lease_provider(_NotCallable())
    assert not is_lease_provider(None)


def test_resolve_provider_falls_back_to_noop(provider: BaseLeaseProvider) -> None:
    assert resolve_provider(provider) is provider
    five = _FiveMethods()
    assert resolve_provider(five) is five
    for not_one in (None, _FourMethods(), object(), "redis://"):
        assert isinstance(resolve_provider(not_one), NoopLeaseProvider)


def test_noop_semantics() -> None:
    noop = NoopLeaseProvider()
    assert noop.acquire_lease(KEY, "a", TTL) == LeaseResult(True, "a", 0)
    assert noop.acquire_lease(KEY, "b", TTL) == LeaseResult(True, "b", 0)  # everyone wins
    assert noop.get_lease_owner(KEY) is None
    assert noop.release_lease(KEY, "zzz") is None
    assert noop.renew_lease(KEY, "zzz", TTL) is True
    assert noop.transfer_lease(KEY, "x", "y", TTL) is True
    assert noop.transfer_to_next(KEY, "a", TTL) is None
    assert noop.take_signals(KEY, "a", 10) == []
    with pytest.raises(InvalidLeaseArgument):
        noop.acquire_lease("", "a", TTL)  # still validates


# -- invalid arguments: a typed error, before any I/O ---------------------------------------------

BAD_KEYS: list[Any] = ["", None, 42, b"bytes", "k" * 1025, "é" * 513, "\ud800"]
BAD_OWNERS: list[Any] = ["", None, 7, "o" * 1025]
BAD_TTLS: list[Any] = [
    0,
    -1,
    True,
    False,
    1.5,
    1000.0,
    math.nan,
    math.inf,
    None,
    "1000",
    86_400_001,
]


def _calls(key: Any = KEY, owner: Any = "b", ttl: Any = TTL) -> list[Any]:
    return [
        lambda p: p.acquire_lease(key, owner, ttl),
        lambda p: p.renew_lease(key, owner, ttl),
        lambda p: p.transfer_lease(key, owner, "c", ttl),
        lambda p: p.transfer_lease(key, "a", owner, ttl),
    ]


@pytest.mark.parametrize("bad", BAD_KEYS, ids=repr)
def test_bad_key_is_refused_before_io(provider: BaseLeaseProvider, bad: Any) -> None:
    provider.acquire_lease(KEY, "a", TTL)
    before = state(provider)
    for call in [*_calls(key=bad), lambda p: p.release_lease(bad, "a")]:
        with pytest.raises(InvalidLeaseArgument):
            call(provider)
    with pytest.raises(InvalidLeaseArgument):
        provider.get_lease_owner(bad)
    assert state(provider) == before


@pytest.mark.parametrize("bad", BAD_OWNERS, ids=repr)
def test_bad_owner_is_refused_before_io(provider: BaseLeaseProvider, bad: Any) -> None:
    provider.acquire_lease(KEY, "a", TTL)
    before = state(provider)
    for call in [*_calls(owner=bad), lambda p: p.release_lease(KEY, bad)]:
        with pytest.raises(InvalidLeaseArgument):
            call(provider)
    assert state(provider) == before


@pytest.mark.parametrize("bad", BAD_TTLS, ids=repr)
def test_bad_ttl_is_refused_before_io(provider: BaseLeaseProvider, bad: Any) -> None:
    provider.acquire_lease(KEY, "a", TTL)
    before = state(provider)
    for call in _calls(owner="a", ttl=bad):
        with pytest.raises(InvalidLeaseArgument):
            call(provider)
    assert state(provider) == before


def test_invalid_argument_is_a_value_error() -> None:
    assert issubclass(InvalidLeaseArgument, ValueError)


def test_key_limits_are_inclusive(provider: BaseLeaseProvider) -> None:
    longest = "k" * 1024
    assert provider.acquire_lease(longest, "o" * 1024, 86_400_000).acquired
    assert provider.get_lease_owner(longest) == "o" * 1024


@pytest.mark.parametrize(
    "key", ["{", "}", "{}", "a}b{c", "%7B", "%", "with space", "new\nline", "日本語", "a\x00b", ":"]
)
def test_awkward_keys_are_distinct_and_usable(provider: BaseLeaseProvider, key: str) -> None:
    neighbours = {"{": "%7B", "%7B": "{", "}": "%7D", "%": "%25"}
    assert provider.acquire_lease(key, "a", TTL).acquired
    assert provider.get_lease_owner(key) == "a"
    other = neighbours.get(key, key + "x")
    assert provider.acquire_lease(other, "b", TTL).acquired  # no collision after escaping
    assert provider.get_lease_owner(key) == "a"
