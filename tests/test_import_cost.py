"""What ``import leaseguard`` loads: pinned by module name, never by a timing.

A Lambda cold start pays for every module a handler's imports load. ``import leaseguard`` loads
the package's ``__init__`` and nothing else (each public name resolves on first use); ``from
leaseguard import lease_owned`` loads the guard's chain, which holds what a guarded call needs
and no client library: redis, boto3, botocore, Powertools and jmespath load when a provider is
built or a feature used, the provider modules when their provider is asked for.

Each check runs a fresh interpreter with ``-S`` (no ``site``, so no ``.pth`` hook such as an
editable install's finder preloads ``pathlib``, ``re`` or ``importlib.util``) and this checkout
plus the environment's site-packages on ``PYTHONPATH``: what it reports beyond the bare ``-S``
interpreter is what leaseguard itself loads. The child lists ``sys.modules`` without ``json``,
which would otherwise hide a ``json`` import. bench/import_time.py measures the time.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

import leaseguard

ROOT = Path(__file__).resolve().parents[1]

# Never loaded by `import leaseguard` nor by `from leaseguard import lease_owned`.
FORBIDDEN = frozenset(
    {
        "redis",
        "boto3",
        "botocore",
        "aws_lambda_powertools",
        "jmespath",
        "leaseguard.providers.redis",
        "leaseguard.providers.dynamodb",
        "leaseguard.providers.memory",
        "leaseguard.providers.noop",
        "leaseguard.testing",
        "leaseguard.cli",
        "leaseguard.simulate",
        # stdlib a guarded call does not need, or needs only on a rare path (imported there)
        "hashlib",  # batch.envelope_batch, SQS FIFO hand-off
        "uuid",  # events.signal_id without a context
        "platform",
        "pathlib",
        "importlib.resources",  # the Redis provider's scripts
        "asyncio",
        "socket",
        "ssl",
        "subprocess",
        "tempfile",
        "random",
        "secrets",
        "datetime",
    }
)

# The whole chain of `from leaseguard import lease_owned`, module by module: a new module here
# is a cold-start cost for every guarded function, so adding one is a decision, not a side effect.
GUARD_CHAIN = frozenset(
    {
        "leaseguard",
        "leaseguard.aws",
        "leaseguard.batch",
        "leaseguard.config",
        "leaseguard.errors",
        "leaseguard.events",
        "leaseguard.guard",
        "leaseguard.guard.call",
        "leaseguard.guard.decorator",
        "leaseguard.guard.drivers",
        "leaseguard.guard.drain",
        "leaseguard.guard.failures",
        "leaseguard.guard.flow",
        "leaseguard.guard.handler",
        "leaseguard.guard.lost",
        "leaseguard.guard.options",
        "leaseguard.guard.policy",
        "leaseguard.guard.responses",
        "leaseguard.guard.retries",
        "leaseguard.guard.tracebacks",
        "leaseguard.handoff",
        "leaseguard.lazy",
        "leaseguard.observability",
        "leaseguard.protocol",
        "leaseguard.protocol.model",
        "leaseguard.protocol.transitions",
        "leaseguard.protocol.operators",
        "leaseguard.protocol.state",
        "leaseguard.providers",
        "leaseguard.providers.base",
        "leaseguard.renewal",
        "leaseguard.renewer",
        "leaseguard.signals",
        "leaseguard.stacking",
        "leaseguard.types",
        "leaseguard.validation",
    }
)

# The standard library the guard's chain may load (top-level packages; their submodules and the
# private C modules behind them, ``_json``, ``_ast``..., come with them).
STDLIB_ALLOWED = frozenset(
    {
        "__future__",
        "ast",
        "atexit",
        "collections",
        "contextlib",
        "contextvars",
        "copy",
        "copyreg",
        "dataclasses",
        "dis",
        "enum",
        "functools",
        "heapq",  # the renewal timer's queue (C-backed, tens of µs)
        "genericpath",
        "importlib",
        "inspect",
        "itertools",
        "json",
        "keyword",
        "linecache",
        "logging",
        "math",
        "opcode",
        "operator",
        "os",
        "posixpath",
        "re",
        "reprlib",
        "stat",
        "string",
        "textwrap",
        "threading",
        "token",
        "tokenize",
        "traceback",
        "types",
        "typing",
        "warnings",
        "weakref",
    }
)


def loaded_by(code: str) -> set[str]:
    """The modules a fresh ``python -S`` has loaded after running ``code``."""
    path = os.pathsep.join([str(ROOT), *site.getsitepackages()])
    listing = "import sys; sys.stdout.write('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-S", "-c", f"{code}\n{listing}"],
        env={**os.environ, "PYTHONPATH": path},
        cwd=ROOT,  # `-c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(done.stdout.split())


@pytest.fixture(scope="module")
def bare() -> set[str]:
    return loaded_by("pass")


def test_import_leaseguard_loads_the_package_alone(bare: set[str]) -> None:
    assert loaded_by("import leaseguard") - bare == {"leaseguard", "leaseguard.lazy"}


def test_the_guard_chain_is_pinned(bare: set[str]) -> None:
    added = loaded_by("from leaseguard import lease_owned") - bare
    assert not added & FORBIDDEN
    assert {m for m in added if m.split(".")[0] == "leaseguard"} == GUARD_CHAIN
    others = {m for m in added if m.split(".")[0] != "leaseguard"}
    assert {m.split(".")[0] for m in others} <= STDLIB_ALLOWED | {
        m for m in others if m.startswith("_") and m in sys.stdlib_module_names
    }


# One test for both (not parametrized): `-k "not (redis or dynamodb)"`, which skips the tests
# that need a server, must keep these, which need none.
PROVIDERS = {
    "RedisLeaseProvider": ("leaseguard.providers.redis", {"redis"}),
    "DynamoDBLeaseProvider": ("leaseguard.providers.dynamodb", {"boto3", "botocore"}),
}


def test_a_provider_loads_its_module_not_its_client(bare: set[str]) -> None:
    for name, (module, client_libraries) in PROVIDERS.items():
        added = loaded_by(f"from leaseguard import {name}") - bare
        assert module in added, name
        assert not added & (client_libraries | {"aws_lambda_powertools", "jmespath"}), name
        others = {m for m, _ in PROVIDERS.values()} - {module}
        assert not added & others, name


def test_every_public_name_resolves_to_its_defining_object() -> None:
    import importlib

    for name in leaseguard.__all__:
        value = getattr(leaseguard, name)
        module = importlib.import_module(f"leaseguard.{leaseguard._EXPORTS[name]}")
        assert value is getattr(module, name), name
    assert set(leaseguard.__all__) == set(leaseguard._EXPORTS)
    assert set(leaseguard.__all__) <= set(dir(leaseguard))
    assert leaseguard.__version__


def test_from_import_and_isinstance_work_in_a_fresh_interpreter() -> None:
    code = (
        "from leaseguard import *\n"
        "import leaseguard\n"
        "from leaseguard import LeaseguardError, QueueFull, InMemoryLeaseProvider\n"
        "from leaseguard.types import LeaseProvider, LeaseResult, is_lease_provider\n"
        "from leaseguard.errors import QueueFull as Q\n"
        "from leaseguard.providers import InMemoryLeaseProvider as M, BaseLeaseProvider\n"
        "assert QueueFull is Q and issubclass(QueueFull, LeaseguardError)\n"
        "assert isinstance(Q('k', 1, 1), leaseguard.LeaseguardError)\n"
        "p = M()\n"
        "assert isinstance(p, InMemoryLeaseProvider) and isinstance(p, BaseLeaseProvider)\n"
        "assert is_lease_provider(p) and isinstance(p, LeaseProvider)\n"
        "assert isinstance(p.acquire_lease('k', 'o', 1000), LeaseResult)\n"
        "for name in leaseguard.__all__: assert globals()[name] is getattr(leaseguard, name)\n"
    )
    assert "leaseguard.guard" in loaded_by(code)


def test_names_moved_out_of_the_package_still_resolve_with_a_deprecation_warning() -> None:
    """leaseguard.__all__ holds what a handler author uses; the names it held before for
    backend authors and operators still resolve, each with a warning naming its module."""
    from leaseguard import types

    assert len(leaseguard.__all__) <= 16 and "lease_owned" in leaseguard.__all__
    with pytest.warns(DeprecationWarning, match="import it from leaseguard.types"):
        assert leaseguard.KeyState is types.KeyState  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="leaseguard.InvalidLeaseArgument"):
        from leaseguard import InvalidLeaseArgument  # type: ignore[attr-defined]  # noqa: F401
    assert not set(leaseguard._MOVED) & set(leaseguard.__all__)


def test_unknown_names_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = leaseguard.nope  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        from leaseguard import nope  # type: ignore[attr-defined]  # noqa: F401
    from leaseguard import providers

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = providers.nope  # type: ignore[attr-defined]
