"""leaseguard's pytest plugin and :func:`~leaseguard.testing.use_provider`: the fixtures are
there in a project of its own, a guarded handler follows the provider a test gives it and
goes back, and one without ``provider=`` follows the environment from one invocation to the
next (it used to keep the first backend it saw for the life of the process)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from leaseguard import config, current_lease, lease_owned
from leaseguard.errors import ConfigurationError
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.providers.memory import InMemoryLeaseProvider
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import DynamoDBServer, LambdaContext, RedisServer, use_provider
from leaseguard.testing import pytest_plugin as plugin

ROOT = Path(__file__).resolve().parents[1]


@lease_owned(key_fn="k")
def from_env(event: dict[str, Any], context: Any) -> Any:
    """A handler without ``provider=``: the environment's provider (or a test's)."""
    return current_lease().provider


OWN = InMemoryLeaseProvider()


@lease_owned(key_fn="k", provider=OWN)
def with_own(event: dict[str, Any], context: Any) -> Any:
    return current_lease().provider


def call(handler: Any) -> Any:
    return handler({"k": "key-1"}, LambdaContext(function_arn=""))


def test_the_env_provider_follows_the_environment_between_invocations(
    monkeypatch: pytest.MonkeyPatch,
    leaseguard_redis_server: RedisServer,
    leaseguard_dynamodb_server: DynamoDBServer,
    leaseguard_dynamodb_table: DynamoDBLeaseProvider,
) -> None:
    monkeypatch.delenv("LEASEGUARD_TABLE_NAME", raising=False)
    monkeypatch.setenv("LEASEGUARD_BACKEND", "redis")
    monkeypatch.setenv("LEASEGUARD_REDIS_URL", leaseguard_redis_server.url)
    monkeypatch.setenv("LEASEGUARD_KEY_PREFIX", f"lgt-env-{os.getpid()}:")
    on_redis = call(from_env)
    assert isinstance(on_redis, RedisLeaseProvider)
    assert call(from_env) is on_redis  # one provider per setting, built once

    monkeypatch.setenv("LEASEGUARD_BACKEND", "dynamodb")
    monkeypatch.setenv("LEASEGUARD_TABLE_NAME", leaseguard_dynamodb_table.table_name)
    monkeypatch.setenv("LEASEGUARD_DYNAMODB_ENDPOINT", leaseguard_dynamodb_server.endpoint_url)
    on_dynamodb = call(from_env)
    assert isinstance(on_dynamodb, DynamoDBLeaseProvider)
    assert on_dynamodb.table_name == leaseguard_dynamodb_table.table_name

    monkeypatch.setenv("LEASEGUARD_BACKEND", "redis")
    monkeypatch.delenv("LEASEGUARD_TABLE_NAME")
    monkeypatch.delenv("LEASEGUARD_DYNAMODB_ENDPOINT")
    assert call(from_env) is on_redis  # back to the first setting: its provider again


def test_use_provider_points_every_handler_at_a_provider_and_back(
    monkeypatch: pytest.MonkeyPatch, leaseguard_memory_provider: InMemoryLeaseProvider
) -> None:
    monkeypatch.setenv("LEASEGUARD_BACKEND", "memory")
    before = call(from_env)
    assert before is not leaseguard_memory_provider
    assert call(with_own) is OWN
    with use_provider(leaseguard_memory_provider) as given:
        assert given is leaseguard_memory_provider
        assert call(from_env) is leaseguard_memory_provider
        assert call(with_own) is leaseguard_memory_provider
        inner = InMemoryLeaseProvider()
        with use_provider(inner):
            assert call(from_env) is inner
        assert call(from_env) is leaseguard_memory_provider
    assert call(from_env) is before
    assert call(with_own) is OWN
    assert config.provider_override() is None


def test_use_provider_ends_with_the_block_when_the_test_fails(
    leaseguard_memory_provider: InMemoryLeaseProvider,
) -> None:
    with pytest.raises(RuntimeError), use_provider(leaseguard_memory_provider):
        raise RuntimeError("the test failed")
    assert config.provider_override() is None


def test_use_provider_refuses_what_is_not_a_provider() -> None:
    with pytest.raises(ConfigurationError, match="lease contract"), use_provider(object()):
        pass


def test_the_env_providers_keep_a_bounded_number(monkeypatch: pytest.MonkeyPatch) -> None:
    providers = config.EnvProviders()
    monkeypatch.setenv("LEASEGUARD_BACKEND", "memory")
    made = []
    for limit in range(1, config.EnvProviders.KEEP + 2):
        monkeypatch.setenv("LEASEGUARD_MAX_QUEUE", str(limit))
        made.append(providers())
        assert providers() is made[-1]
    assert len({id(p) for p in made}) == len(made)
    monkeypatch.setenv("LEASEGUARD_MAX_QUEUE", "1")  # the oldest, dropped: built anew
    assert providers() is not made[0]


def test_the_fixtures_give_working_providers(
    leaseguard_memory_provider: InMemoryLeaseProvider,
    leaseguard_redis: RedisLeaseProvider,
    leaseguard_dynamodb_table: DynamoDBLeaseProvider,
    lambda_context: LambdaContext,
) -> None:
    for provider in (leaseguard_memory_provider, leaseguard_redis, leaseguard_dynamodb_table):
        granted = provider.acquire_lease("k", "me", 10_000)
        assert granted.acquired and provider.get_lease_owner("k") == "me"
    assert lambda_context.get_remaining_time_in_millis() > 0
    assert lambda_context.invoked_function_arn == ""


def test_the_plugin_is_registered_and_serves_a_project_of_its_own(tmp_path: Path) -> None:
    registered = {e.name: e.value for e in entry_points(group="pytest11")}
    assert registered.get("leaseguard") == "leaseguard.testing.pytest_plugin"
    (tmp_path / "test_user.py").write_text(
        "from leaseguard import lease_owned\n"
        "from leaseguard.testing import use_provider\n\n"
        "@lease_owned(key_fn='id')\n"
        "def handler(event, context):\n"
        "    return 'ran'\n\n"
        "def test_it(leaseguard_memory_provider, lambda_context):\n"
        "    with use_provider(leaseguard_memory_provider):\n"
        "        assert handler({'id': 'x'}, lambda_context) == 'ran'\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def fixture_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and any(
            "fixture" in ast.unparse(d) for d in node.decorator_list
        ):
            names.add(node.name)
    return names


def test_the_plugin_fixtures_clash_with_no_fixture_of_this_repository() -> None:
    ours = fixture_names(Path(plugin.__file__))
    assert ours == {
        "leaseguard_memory_provider",
        "leaseguard_redis_server",
        "leaseguard_redis",
        "leaseguard_dynamodb_server",
        "leaseguard_dynamodb_table",
        "lambda_context",
    }
    for path in ROOT.glob("tests/**/*.py"):
        assert not ours & fixture_names(path), path


@pytest.mark.parametrize("document", ["README.md", "docs/testing.md"])
def test_the_docs_show_the_example_test_verbatim(document: str) -> None:
    example = (ROOT / "tests/test_readme_testing_example.py").read_text()
    assert f"```python\n{example}```\n" in (ROOT / document).read_text()
