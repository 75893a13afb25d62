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

from .types import LEASE_PROVIDER_METHODS, LeaseProvider, LeaseResult, is_lease_provider

__all__ = [
    "LEASE_PROVIDER_METHODS",
    "LeaseProvider",
    "LeaseResult",
    "is_lease_provider",
    "resolve_provider",
]


def resolve_provider(obj: object) -> LeaseProvider:
    """``obj`` when it is a lease provider, else a
    :class:`~leaseguard.providers.noop.NoopLeaseProvider` (every caller wins; release, renew
    and transfer are inert), which keeps single-process behaviour when no backend can lease."""
    if is_lease_provider(obj):
        return obj  # type: ignore[return-value]
    from .providers.noop import NoopLeaseProvider

    return NoopLeaseProvider()
