"""What a new user installs: ``make dist``'s wheel and sdist, the extras the README lists, and
the one line a missing extra becomes.

A missing package is made missing for real, in a child interpreter: ``sys.modules[name] =
None`` makes every ``import name`` there fail with the ``ModuleNotFoundError`` an uninstalled
package gives. Nothing of leaseguard is replaced.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from leaseguard.errors import (
    EXTRA_MODULES,
    LeaseguardError,
    MissingExtra,
    extra_of,
    extra_required,
)

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
USER_EXTRAS = {"redis", "dynamodb", "powertools", "embedded", "cli", "testing"}


def run_without(modules: list[str], code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter in which each of ``modules`` cannot be imported."""
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in modules)
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **env},
    )


def cli_without(modules: list[str], *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_without(
        modules, f"from leaseguard.cli import main\nsys.exit(main({list(argv)!r}))", **env
    )


# -- the typed error ----------------------------------------------------------------------------


def test_missing_extra_is_a_leaseguard_error_and_an_import_error() -> None:
    error = MissingExtra("cli", "rich", "the simulator's report")
    assert isinstance(error, LeaseguardError)
    assert isinstance(error, ImportError)
    assert (error.extra, error.module, error.name) == ("cli", "rich", "rich")
    assert "install leaseguard[cli]" in str(error)


def test_only_a_package_of_the_extra_is_translated() -> None:
    with pytest.raises(ModuleNotFoundError) as caught, extra_required("cli", "a test"):
        import leaseguard_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(caught.value, MissingExtra)


def test_every_user_extra_of_pyproject_is_known_and_no_other() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"]) - {"dev", "bench"}
    assert extras == USER_EXTRAS == set(EXTRA_MODULES)
    assert extra_of("redis.cluster") == "redis"
    assert extra_of("botocore.config") == "dynamodb"
    assert extra_of("rich") == "cli"
    assert extra_of("json") is None


# -- where an optional import happens -----------------------------------------------------------


@pytest.mark.parametrize(
    ("missing", "argv", "extra"),
    [
        (["rich"], ["simulate", "--memory", "--invocations", "4"], "cli"),
        (["matplotlib"], ["simulate", "--memory", "--plot", "x.png"], "cli"),
        (
            ["boto3", "botocore"],
            ["inspect", "k", "--dynamodb-endpoint", "http://127.0.0.1:9", "--table", "leases"],
            "dynamodb",
        ),
        (["redis"], ["inspect", "k", "--redis-url", "redis://127.0.0.1:9"], "redis"),
    ],
    ids=["simulate-rich", "simulate-plot-matplotlib", "inspect-boto3", "inspect-redis"],
)
def test_the_cli_names_the_extra_to_install(
    missing: list[str], argv: list[str], extra: str
) -> None:
    done = cli_without(missing, *argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert f"install leaseguard[{extra}]" in lines[0]
    assert "unexpected" not in lines[0] and "Traceback" not in done.stderr


def test_a_provider_built_without_its_client_library_raises_missing_extra() -> None:
    code = """
from leaseguard.errors import MissingExtra
from leaseguard import RedisLeaseProvider, DynamoDBLeaseProvider
for build, extra in (
    (lambda: RedisLeaseProvider.from_url("redis://127.0.0.1:9"), "redis"),
    (lambda: DynamoDBLeaseProvider("leases", region_name="us-east-1"), "dynamodb"),
):
    try:
        build()
    except MissingExtra as exc:
        print(exc.extra, exc.module)
"""
    done = run_without(["redis", "boto3", "botocore"], code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["redis redis", "dynamodb botocore"]


def test_a_guarded_handler_without_its_backend_library_names_the_extra() -> None:
    code = """
from leaseguard import lease_owned
from leaseguard.errors import MissingExtra

@lease_owned(key_fn="id")
def handler(event, context):
    return "ran"

try:
    handler({"id": "k"}, None)
except MissingExtra as exc:
    print(exc.extra)
"""
    done = run_without(
        ["redis"],
        code,
        LEASEGUARD_BACKEND="redis",
        LEASEGUARD_REDIS_URL="redis://127.0.0.1:9",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "redis"


def test_dynamodb_server_without_moto_names_the_testing_extra() -> None:
    code = """
from leaseguard.errors import MissingExtra
from leaseguard.testing import DynamoDBServer
try:
    DynamoDBServer().start()
except MissingExtra as exc:
    print(exc.extra, exc.module)
"""
    done = run_without(["moto"], code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "testing moto"


# -- make dist, and what the docs tell a user ---------------------------------------------------


@pytest.mark.slow
def test_make_dist_builds_a_wheel_and_sdist_that_install(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # -o: never reinstall .venv from inside a test run, even if pyproject.toml is newer.
    done = subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed-dev", "dist", f"DIST_DIR={dist}"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    version = PYPROJECT["project"]["version"]
    wheel = dist / f"leaseguard-{version}-py3-none-any.whl"
    assert {p.name for p in dist.iterdir()} == {wheel.name, f"leaseguard-{version}.tar.gz"}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"leaseguard-{version}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "leaseguard/py.typed" in names
    lua = {p.name for p in (ROOT / "leaseguard/providers/lua").glob("*.lua")}
    assert {n.rsplit("/", 1)[1] for n in names if n.endswith(".lua")} == lua
    provided = {
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Provides-Extra:")
    }
    assert provided >= USER_EXTRAS
    assert "leaseguard = leaseguard.cli:main" in entry_points
    assert "[pytest11]\nleaseguard = leaseguard.testing.pytest_plugin" in entry_points

    # Installed alone into a fresh virtualenv, the wheel runs and finds its Lua scripts.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    uv = Path(sys.executable).with_name("uv")
    install = [str(uv), "pip", "install", "-q", "--python", str(venv / "bin/python")]
    subprocess.run([*install, "--no-deps", str(wheel)], check=True, timeout=120)
    check = subprocess.run(
        [
            venv / "bin/python",
            "-c",
            "from leaseguard.providers.redis.scripts import ACQUIRE_LUA; "
            "print(len(ACQUIRE_LUA.text) > 0)",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert check.stdout.strip() == "True", check.stderr


def test_the_readme_lists_every_extra_with_one_line() -> None:
    readme = (ROOT / "README.md").read_text()
    for extra in USER_EXTRAS:
        assert sum(line.startswith(f"| `{extra}` |") for line in readme.splitlines()) == 1, extra


def test_deploy_md_says_how_to_depend_on_leaseguard_without_pypi() -> None:
    deploy = (ROOT / "docs/deploy.md").read_text()
    assert "## Depending on leaseguard" in deploy
    assert "leaseguard[dynamodb,redis,powertools] @ git+https://" in deploy
    assert "make dist" in deploy
    # The old advice, a bare requirement pip would look for on PyPI, is gone.
    assert "write\n`leaseguard[dynamodb,redis,powertools]` there instead" not in deploy
