"""``RedisLeaseProvider.from_url``: TLS (``rediss://``), ACL users, bad credentials."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from leaseguard import LeaseBackendError, RedisLeaseProvider, Signal
from leaseguard.providers.redis import ACL_COMMANDS
from leaseguard.testing import RedisServer

# What a least-privilege ACL user needs: leaseguard's commands (scripts run theirs with the
# caller's permissions), plus the connection handshake redis-py itself sends.
LEAST_PRIVILEGE = " ".join(f"+{c}" for c in (*ACL_COMMANDS, "ping", "hello"))


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command(
            "ACL",
            "SETUSER",
            "lease-app",
            "on",
            ">s3cret",
            "~lg:*",
            "resetchannels",
            "-@all",
            *LEAST_PRIVILEGE.split(),
        )
        admin.close()
        yield server


def lifecycle(provider: RedisLeaseProvider) -> None:
    first = provider.acquire_lease("k", "a", 5_000)
    assert first.acquired
    assert provider.acquire_or_enqueue("k", Signal("s1", {"x": 1}), 5_000).position == 1
    assert provider.renew_lease("k", "a", 5_000)
    assert provider.pending_signals("k") == 1
    nxt = provider.transfer_to_next("k", "a", 5_000)
    assert nxt is not None and nxt.id == "s1" and nxt.token and first.token
    assert nxt.token > first.token
    assert provider.get_lease_owner("k") == "s1"
    assert provider.inspect_key("k").in_flight == ("s1",)
    assert provider.adopt_orphans(5_000, 10) == []
    assert provider.transfer_to_next("k", "s1", 5_000) is None


def test_acl_user_with_least_privilege(acl_server: RedisServer) -> None:
    url = f"redis://lease-app:s3cret@127.0.0.1:{acl_server.port}/0"
    lifecycle(RedisLeaseProvider.from_url(url))


def test_acl_user_cannot_touch_other_prefixes(acl_server: RedisServer) -> None:
    url = f"redis://lease-app:s3cret@127.0.0.1:{acl_server.port}/0"
    outside = RedisLeaseProvider.from_url(url, prefix="other:")
    with pytest.raises(LeaseBackendError, match=r"(?i)no permissions"):
        outside.acquire_lease("k", "a", 5_000)


def test_wrong_password_is_a_backend_error_without_the_secret(acl_server: RedisServer) -> None:
    url = f"redis://lease-app:wrong-secret@127.0.0.1:{acl_server.port}/0"
    provider = RedisLeaseProvider.from_url(url)
    with pytest.raises(LeaseBackendError) as info:
        provider.acquire_lease("k", "a", 5_000)
    assert "wrong-secret" not in str(info.value)


def test_rediss_with_tls() -> None:
    with RedisServer(tls=True) as server:
        assert server.url.startswith("rediss://") and server.ca_file
        provider = RedisLeaseProvider.from_url(server.url, ssl_ca_certs=server.ca_file)
        lifecycle(provider)
        # Without trusting the server's certificate, the connection is refused.
        untrusted = RedisLeaseProvider.from_url(server.url)
        with pytest.raises(LeaseBackendError, match=r"(?i)certificate|ssl"):
            untrusted.acquire_lease("k2", "a", 5_000)


def test_from_url_refuses_other_schemes() -> None:
    for url in ("http://localhost:6379", "localhost:6379", ""):
        with pytest.raises(ValueError, match="redis://"):
            RedisLeaseProvider.from_url(url)
