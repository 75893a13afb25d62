"""The decorator's settings: two typed groups (HandoffConfig, RetryConfig), each setting defined
once; the keywords of 0.1 still work, with a DeprecationWarning; bad settings are refused when
the handler is decorated, before any backend call."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from leaseguard import (
    ConfigurationError,
    HandoffConfig,
    InMemoryLeaseProvider,
    RetryConfig,
    lease_owned,
)
from leaseguard.guard.options import LEGACY_KEYWORDS, GuardOptions


def _options(**settings: Any) -> GuardOptions:
    guarded = lease_owned("k", provider=InMemoryLeaseProvider(), **settings)(
        lambda event, context: None
    )
    options: GuardOptions = guarded.__leaseguard__.options  # type: ignore[attr-defined]
    return options


def test_the_groups_reach_the_guard_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEGUARD_MAX_ATTEMPTS", "7")
    monkeypatch.setenv("LEASEGUARD_DRAIN_BATCH", "5")
    options = _options(
        handoff=HandoffConfig("invoke", margin_ms=1_000, caller_waits=True),
        retries=RetryConfig(delay_ms=2_000, on_poison="halt"),
    )
    assert (options.handoff.mode, options.handoff.margin_ms) == ("invoke", 1_000)
    assert options.handoff.caller_waits is True and options.drain_batch == 5  # from the env
    assert (options.max_attempts, options.retry_delay_ms) == (7, 2_000)
    assert options.retries.on_poison == "halt" and options.retry_max_delay_ms == 300_000


def test_a_mode_string_is_the_groups_mode() -> None:
    assert _options(handoff="inline").handoff == HandoffConfig("inline", drain_batch=0)


@pytest.mark.parametrize(
    ("keyword", "value", "group", "field"),
    [
        (keyword, value, *LEGACY_KEYWORDS[keyword])
        for keyword, value in [
            (
                "handoff_margin_ms",
                1_234,
            ),
            ("queue_url", "https://q"),
            ("drain_batch", 4),
            ("lambda_client", object()),
            ("sqs_client", object()),
            ("max_attempts", 9),
            ("on_poison", "halt"),
            ("dead_letter_queue_url", "https://dlq"),
        ]
    ],
)
def test_the_keywords_of_0_1_still_work_with_a_warning(
    keyword: str, value: Any, group: str, field: str
) -> None:
    with pytest.warns(DeprecationWarning, match=rf"{keyword}=.*{field}=") as caught:
        options = _options(**{keyword: value})
    assert caught[0].filename == __file__  # the warning points at the decorated handler's line
    assert getattr(getattr(options, group), field) == value


def test_a_setting_given_both_ways_or_unknown_is_refused() -> None:
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ConfigurationError, match="max_attempts given both as a keyword and in"),
    ):
        _options(max_attempts=2, retries=RetryConfig(max_attempts=3))
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_attempt'"):
        _options(max_attempt=2)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"handoff": "later"}, "handoff must be one of"),
        ({"handoff": HandoffConfig("sqs")}, 'handoff="sqs" needs queue_url'),
        ({"handoff": HandoffConfig(drain_batch=-1)}, "drain_batch must be positive"),
        ({"retries": RetryConfig(max_attempts=0)}, "max_attempts must be positive"),
        ({"retries": RetryConfig(on_poison="stop")}, "on_poison must be one of"),  # type: ignore[arg-type]
    ],
)
def test_bad_settings_are_refused_at_decoration(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        _options(**settings)


def test_each_setting_is_defined_once() -> None:
    """The decorator's own parameters and the groups' fields do not overlap, and every
    keyword of 0.1 names a field of its group."""
    parameters = set(inspect.signature(lease_owned).parameters) - {"deprecated"}
    handoff = {f.name for f in dataclasses.fields(HandoffConfig)}
    retries = {f.name for f in dataclasses.fields(RetryConfig)}
    assert not parameters & (handoff | retries) - {"handoff"}
    assert not handoff & retries
    for group, field in LEGACY_KEYWORDS.values():
        assert field in (handoff if group == "handoff" else retries)
    assert len(parameters) <= 14
