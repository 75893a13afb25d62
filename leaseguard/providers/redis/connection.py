"""Building a redis-py client, standalone or Cluster, from a URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leaseguard.errors import InvalidLeaseArgument, LeaseBackendError, extra_required

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

URL_SCHEMES = ("redis://", "rediss://", "unix://")


def redact_url(url: str) -> str:
    """``url`` with its credentials (``user:password@``) replaced by ``***@``, for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest


def connect(
    url: str, *, cluster: bool, socket_timeout: float, **client_options: Any
) -> Redis | RedisCluster:
    """A client for a ``redis://``, ``rediss://`` or ``unix://`` URL; ``cluster=True`` makes a
    ``RedisCluster`` client that discovers the other nodes from this one."""
    if not isinstance(url, str) or not url.startswith(URL_SCHEMES):
        raise InvalidLeaseArgument("url must start with redis://, rediss:// or unix://")
    with extra_required("redis", "the Redis provider"):
        import redis
        from redis.backoff import ExponentialWithJitterBackoff
        from redis.cluster import RedisCluster
        from redis.retry import Retry

    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
        # redis-py's default (10 retries, backoff up to 1 s) would hold a renewal far past
        # a typical TTL; every script is safe to resend after an ambiguous failure.
        "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), 3),
        **client_options,
    }
    try:
        if cluster:
            return RedisCluster.from_url(url, **options)
        return redis.Redis.from_url(url, **options)
    except redis.exceptions.RedisError as exc:
        raise LeaseBackendError(f"cannot connect to Redis at {redact_url(url)}: {exc}") from exc
