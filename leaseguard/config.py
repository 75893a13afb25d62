"""Provider configuration: from ``LEASEGUARD_*`` environment variables or in code.

A :class:`ProviderConfig` is a small picklable value, so the same description builds a provider
in a Lambda function (from the environment), in the CLI, and in every worker process of the
simulator.

=================================  ==============================================================
``LEASEGUARD_BACKEND``             ``redis``, ``dynamodb``, ``memory`` or ``noop``. Unset: the
                                   backend the variables below imply; with none of them, inside
                                   Lambda (``AWS_LAMBDA_FUNCTION_NAME`` set) a
                                   :class:`ConfigurationError` (fail closed), elsewhere ``noop``
                                   with a warning
``LEASEGUARD_REDIS_URL``           ``redis://``/``rediss://`` URL, ACL user and password inline
``LEASEGUARD_REDIS_CLUSTER``       ``true`` to use a Redis Cluster client
``LEASEGUARD_KEY_PREFIX``          Redis key prefix (default ``lg:``)
``LEASEGUARD_REDIS_REPLICAS``      replicas that must acknowledge each Redis write step
                                   (``WAIT``; default 0, off), within
                                   ``LEASEGUARD_REDIS_REPLICA_TIMEOUT_MS`` (default 500): see
                                   docs/deploy.md
``LEASEGUARD_TABLE_NAME``          DynamoDB table (see ``docs/dynamodb.md`` for the schema)
``LEASEGUARD_DYNAMODB_ENDPOINT``   endpoint override (DynamoDB Local, moto); normally unset
``LEASEGUARD_CLOCK_SKEW_MS``       DynamoDB clock-skew margin (default 1000)
``LEASEGUARD_TTL_MS``              lease TTL of ``@lease_owned`` (default 15000)
``LEASEGUARD_MAX_PAYLOAD_BYTES``   signal payload limit (default 6291456, Lambda's own)
``LEASEGUARD_MAX_QUEUE``           signals a key may queue before forwards get ``QueueFull``
                                   (default 1000)
``LEASEGUARD_MAX_ATTEMPTS``        failed runs before a signal is dead-lettered (default 3; read
                                   by ``@lease_owned``, as ``LEASEGUARD_DRAIN_BATCH`` is)
``LEASEGUARD_DEAD_LIMIT``          dead letters a key keeps before a failure halts it (default
                                   and most 100)
=================================  ==============================================================
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, cast

from leaseguard.errors import ConfigurationError, InvalidLeaseArgument
from leaseguard.protocol.model import DEAD_LIMIT, DEFAULT_MAX_QUEUE
from leaseguard.providers.base import MAX_QUEUE_LIMIT
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES, check_positive_int, check_ttl

if TYPE_CHECKING:
    from leaseguard.providers.base import BaseLeaseProvider

Backend = Literal["redis", "dynamodb", "memory", "noop"]
BACKENDS: tuple[Backend, ...] = ("redis", "dynamodb", "memory", "noop")
DEFAULT_TTL_MS = 15_000


def _default_clock_skew_ms() -> int:
    # Defined by the DynamoDB provider, its only user, and read here on use: this module is on
    # every guarded function's import chain and the provider imports nothing from it.
    from leaseguard.providers.dynamodb.schema import DEFAULT_CLOCK_SKEW_MS

    return DEFAULT_CLOCK_SKEW_MS


@dataclass(frozen=True)
class ProviderConfig:
    """Everything needed to build a provider; :meth:`build` makes one."""

    backend: Backend = "noop"
    redis_url: str | None = None
    redis_cluster: bool = False
    key_prefix: str = "lg:"
    redis_replicas: int = 0
    redis_replica_timeout_ms: int | None = None
    """``None``: the provider's default (one place: ``DEFAULT_REPLICA_TIMEOUT_MS`` of the Redis
    provider, which this module does not import)."""
    table_name: str | None = None
    dynamodb_endpoint: str | None = None
    region_name: str | None = None
    clock_skew_ms: int = field(default_factory=_default_clock_skew_ms)
    ttl_ms: int = DEFAULT_TTL_MS
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_queue: int = DEFAULT_MAX_QUEUE
    dead_limit: int = DEAD_LIMIT

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigurationError(
                f"LEASEGUARD_BACKEND must be one of {', '.join(BACKENDS)}, got {self.backend!r}"
            )
        if self.backend == "redis" and not self.redis_url:
            raise ConfigurationError("the redis backend needs LEASEGUARD_REDIS_URL")
        if self.backend == "dynamodb" and not self.table_name:
            raise ConfigurationError("the dynamodb backend needs LEASEGUARD_TABLE_NAME")
        # the providers' own checks, before any client is made, named by their variables
        try:
            check_ttl(self.ttl_ms)
        except InvalidLeaseArgument as exc:
            raise ConfigurationError(f"LEASEGUARD_TTL_MS: {exc}") from exc
        bounded = (
            ("LEASEGUARD_MAX_QUEUE", "max_queue", self.max_queue, MAX_QUEUE_LIMIT),
            ("LEASEGUARD_DEAD_LIMIT", "dead_limit", self.dead_limit, DEAD_LIMIT),
        )
        for variable, name, value, maximum in bounded:
            try:
                check_positive_int(name, value, maximum)
            except InvalidLeaseArgument as exc:
                raise ConfigurationError(f"{variable}: {exc}") from exc

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProviderConfig:
        env = os.environ if environ is None else environ
        backend = env.get("LEASEGUARD_BACKEND", "").strip().lower()
        if not backend:
            if env.get("LEASEGUARD_REDIS_URL"):
                backend = "redis"
            elif env.get("LEASEGUARD_TABLE_NAME"):
                backend = "dynamodb"
            elif env.get("AWS_LAMBDA_FUNCTION_NAME"):
                # Deployed with no backend, every invocation would run uncoordinated: the very
                # thing leaseguard exists to prevent. Say so on the first invocation instead.
                raise ConfigurationError(
                    "no lease backend configured in this Lambda function: set "
                    "LEASEGUARD_BACKEND=redis with LEASEGUARD_REDIS_URL, or "
                    "LEASEGUARD_BACKEND=dynamodb with LEASEGUARD_TABLE_NAME "
                    "(LEASEGUARD_BACKEND=noop runs every invocation uncoordinated, on purpose)"
                )
            else:
                warnings.warn(
                    "no LEASEGUARD_BACKEND configured: using the no-op provider, which "
                    "coordinates nothing across invocations",
                    stacklevel=2,
                )
                backend = "noop"
        return cls(
            backend=cast(Backend, backend),
            redis_url=env.get("LEASEGUARD_REDIS_URL") or None,
            redis_cluster=_flag(env, "LEASEGUARD_REDIS_CLUSTER"),
            key_prefix=env.get("LEASEGUARD_KEY_PREFIX", "lg:"),
            redis_replicas=env_int("LEASEGUARD_REDIS_REPLICAS", 0, env),
            redis_replica_timeout_ms=_optional_int(env, "LEASEGUARD_REDIS_REPLICA_TIMEOUT_MS"),
            table_name=env.get("LEASEGUARD_TABLE_NAME") or None,
            dynamodb_endpoint=env.get("LEASEGUARD_DYNAMODB_ENDPOINT") or None,
            region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            clock_skew_ms=env_int("LEASEGUARD_CLOCK_SKEW_MS", _default_clock_skew_ms(), env),
            ttl_ms=env_int("LEASEGUARD_TTL_MS", DEFAULT_TTL_MS, env),
            max_payload_bytes=env_int(
                "LEASEGUARD_MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES, env
            ),
            max_queue=env_int("LEASEGUARD_MAX_QUEUE", DEFAULT_MAX_QUEUE, env),
            dead_limit=env_int("LEASEGUARD_DEAD_LIMIT", DEAD_LIMIT, env),
        )

    def build(self) -> BaseLeaseProvider:
        """A new provider (and client) for this configuration."""
        if self.backend == "redis":
            from leaseguard.providers.redis import RedisLeaseProvider
            from leaseguard.providers.redis.replication import (
                DEFAULT_REPLICA_TIMEOUT_MS,
                DEFAULT_SOCKET_TIMEOUT_S,
                check_replication,
            )

            timeout = self.redis_replica_timeout_ms
            if timeout is None:
                timeout = DEFAULT_REPLICA_TIMEOUT_MS
            try:
                check_replication(None, self.redis_replicas, timeout, DEFAULT_SOCKET_TIMEOUT_S)
            except InvalidLeaseArgument as exc:
                raise ConfigurationError(
                    f"LEASEGUARD_REDIS_REPLICAS / LEASEGUARD_REDIS_REPLICA_TIMEOUT_MS: {exc}"
                ) from exc
            return RedisLeaseProvider.from_url(
                self.redis_url or "",  # never empty: __post_init__ refused that
                cluster=self.redis_cluster,
                prefix=self.key_prefix,
                max_payload_bytes=self.max_payload_bytes,
                max_queue=self.max_queue,
                dead_limit=self.dead_limit,
                replicas=self.redis_replicas,
                replica_timeout_ms=timeout,
            )
        if self.backend == "dynamodb":
            from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

            return DynamoDBLeaseProvider(
                self.table_name or "",  # never empty: __post_init__ refused that
                endpoint_url=self.dynamodb_endpoint,
                region_name=self.region_name,
                clock_skew_ms=self.clock_skew_ms,
                max_payload_bytes=self.max_payload_bytes,
                max_queue=self.max_queue,
                dead_limit=self.dead_limit,
            )
        if self.backend == "memory":
            from leaseguard.providers.memory import InMemoryLeaseProvider

            return InMemoryLeaseProvider(
                max_payload_bytes=self.max_payload_bytes,
                max_queue=self.max_queue,
                dead_limit=self.dead_limit,
            )
        from leaseguard.providers.noop import NoopLeaseProvider

        return NoopLeaseProvider(max_payload_bytes=self.max_payload_bytes)


ENV_NAMES = (
    "LEASEGUARD_BACKEND",
    "LEASEGUARD_REDIS_URL",
    "LEASEGUARD_REDIS_CLUSTER",
    "LEASEGUARD_KEY_PREFIX",
    "LEASEGUARD_REDIS_REPLICAS",
    "LEASEGUARD_REDIS_REPLICA_TIMEOUT_MS",
    "LEASEGUARD_TABLE_NAME",
    "LEASEGUARD_DYNAMODB_ENDPOINT",
    "LEASEGUARD_CLOCK_SKEW_MS",
    "LEASEGUARD_TTL_MS",
    "LEASEGUARD_MAX_PAYLOAD_BYTES",
    "LEASEGUARD_MAX_QUEUE",
    "LEASEGUARD_DEAD_LIMIT",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_LAMBDA_FUNCTION_NAME",
)
"""Every variable :meth:`ProviderConfig.from_env` reads: what a built provider is cached by."""


class EnvProviders:
    """:func:`provider_from_env`: the provider the environment describes, one per distinct
    setting of :data:`ENV_NAMES`, or the provider a test put in its place.

    Every guarded handler without ``provider=`` asks here on each use, so a change of the
    environment (a test that switches from Redis to DynamoDB) or an override
    (:func:`leaseguard.testing.use_provider`) takes effect at the next invocation; in Lambda,
    where the environment never changes, each use is one dictionary lookup of the same
    provider, whose client and connections are reused across invocations.
    """

    KEEP = 8
    """Providers kept for settings seen before (a test session's handful of backends); the
    oldest is dropped beyond that."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[tuple[str | None, ...], BaseLeaseProvider] = {}
        self._overrides: list[object] = []

    def __call__(self) -> BaseLeaseProvider:
        override = self.override()
        if override is not None:
            return cast("BaseLeaseProvider", override)
        setting = tuple(os.environ.get(name) for name in ENV_NAMES)
        made = self._built.get(setting)
        if made is not None:
            return made
        with self._lock:  # two threads' first invocations build one provider, not two
            made = self._built.get(setting)
            if made is None:
                made = ProviderConfig.from_env().build()
                if len(self._built) >= self.KEEP:
                    del self._built[next(iter(self._built))]
                self._built[setting] = made
            return made

    def override(self) -> object | None:
        """The provider of the innermost :meth:`overriding` block, or ``None``."""
        return self._overrides[-1] if self._overrides else None

    @contextmanager
    def overriding(self, provider: object) -> Iterator[object]:
        """Every guarded handler uses ``provider`` until the block ends (all threads: a
        renewal thread must see what its handler sees)."""
        self._overrides.append(provider)
        try:
            yield provider
        finally:
            self._overrides.remove(provider)

    def cache_clear(self) -> None:
        """Forget every provider built from the environment (the next use builds anew)."""
        with self._lock:
            self._built.clear()


_ENV_PROVIDERS = EnvProviders()
provider_from_env = _ENV_PROVIDERS
"""The provider the environment describes (``provider_from_env()``); see :class:`EnvProviders`."""


def provider_override() -> object | None:
    """The provider a test put in place of every guarded handler's, or ``None``."""
    return _ENV_PROVIDERS.override()


def overriding_provider(provider: object) -> AbstractContextManager[object]:
    """Every guarded handler uses ``provider`` until the ``with`` block ends (what
    :func:`leaseguard.testing.use_provider` does)."""
    return _ENV_PROVIDERS.overriding(provider)


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigurationError(f"{name} must be true or false, got {value!r}")


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    """The integer in ``name``, or ``None`` when it is unset or blank."""
    raw = env.get(name)
    return None if raw is None or not raw.strip() else env_int(name, 0, env)


def env_int(name: str, default: int, env: Mapping[str, str] | None = None) -> int:
    """The integer in environment variable ``name`` (``default`` when unset or blank), or a
    :class:`ConfigurationError` naming the variable."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from exc
