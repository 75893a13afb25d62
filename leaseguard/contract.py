"""The lease contract: five methods any backend can implement, detected structurally.

Semantics every provider keeps (the contract suite in ``tests/test_contract.py`` checks each
line on every backend):

* ``acquire_lease(key, owner, ttl_ms)``: a free or expired key goes to ``owner`` with a new
  fencing token. The current owner acquiring again succeeds and refreshes the TTL, keeping its
  token. Anyone else is refused, and the result names the live holder, read in the same atomic
  step as the refusal.
* ``get_lease_owner(key)``: the live holder, or ``None``.
* ``release_lease(key, owner)``: frees the key if ``owner`` holds it; otherwise does nothing.
* ``renew_lease(key, owner, ttl_ms)``: extends the lease if ``owner`` still holds it and
  returns ``True``; an expired lease is never brought back (``False``).
* ``transfer_lease(key, from_owner, to_owner, ttl_ms)``: moves a held lease to ``to_owner``
  with a new token and a fresh TTL, with no moment where the key is free (when the provider's
  ``atomic_transfer`` is true). ``False`` when ``from_owner`` no longer holds it.

**Fencing tokens** strictly increase per key every time the key gets a new owner, and never go
backwards, also after a lease expired or was released. Each provider documents how.

Invalid arguments raise :class:`~leaseguard.errors.InvalidLeaseArgument` before any I/O;
backend failures raise :class:`~leaseguard.errors.LeaseBackendError` and never pass for
"not acquired".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .signals import Signal

LEASE_PROVIDER_METHODS = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


@dataclass(frozen=True)
class LeaseResult:
    """The outcome of an acquire.

    ``owner`` is the holder after the call (the caller when ``acquired``), ``token`` the
    holder's fencing token when known. The queue step
    (:meth:`~leaseguard.signals.SignalQueue.acquire_or_enqueue`) also fills ``position``
    (1-based place of the queued signal, when not acquired) and ``adopted`` (the orphaned
    signal the caller now owns and must run before its own, when acquired) and ``attempts``.
    """

    acquired: bool
    owner: str | None
    token: int | None
    position: int | None = None
    adopted: Signal | None = None
    attempts: int = 0
    """When the caller's own signal was granted: its failed runs so far (a platform retry of an
    event that failed before resumes the count; see ``max_attempts``)."""


@runtime_checkable
class LeaseProvider(Protocol):
    """The structural lease contract. Check with :func:`is_lease_provider`, not isinstance:
    a backend from another package need not import this class."""

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult: ...

    def get_lease_owner(self, key: str) -> str | None: ...

    def release_lease(self, key: str, owner: str) -> None: ...

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool: ...

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool: ...


def is_lease_provider(obj: object) -> bool:
    """True when ``obj`` has all five contract methods as callables (four is not enough)."""
    return all(callable(getattr(obj, name, None)) for name in LEASE_PROVIDER_METHODS)


def resolve_provider(obj: object) -> LeaseProvider:
    """``obj`` when it is a lease provider, else a
    :class:`~leaseguard.providers.noop.NoopLeaseProvider` (every caller wins; release, renew
    and transfer are inert), which keeps single-process behaviour when no backend can lease."""
    if is_lease_provider(obj):
        return obj  # type: ignore[return-value]
    from .providers.noop import NoopLeaseProvider

    return NoopLeaseProvider()
