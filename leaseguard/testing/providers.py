"""Pointing guarded handlers at a provider for a test, and back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from leaseguard import config
from leaseguard.errors import ConfigurationError
from leaseguard.types import is_lease_provider, is_signal_queue

P = TypeVar("P")


@contextmanager
def use_provider(provider: P) -> Iterator[P]:
    """Run every guarded handler on ``provider`` until the ``with`` block ends.

    It takes the place of the environment's provider (``LEASEGUARD_*``) and of one given as
    ``@lease_owned(provider=...)``, in every thread, from the next use on; when the block ends,
    each handler goes back to its own (the environment's is resolved again, so a test that
    changed ``LEASEGUARD_*`` meanwhile gets the provider the new setting describes). Blocks
    nest: the innermost wins.

    >>> from leaseguard.providers.memory import InMemoryLeaseProvider
    >>> with use_provider(InMemoryLeaseProvider()) as provider:  # doctest: +SKIP
    ...     handler({"threadId": "t-1"}, LambdaContext())

    Raises
    ------
    ConfigurationError
        ``provider`` implements the lease contract or the signal queue only partly.
    """
    if not (is_lease_provider(provider) and is_signal_queue(provider)):
        raise ConfigurationError(
            "use_provider needs a provider of the lease contract and the signal queue, got "
            f"{type(provider).__name__}"
        )
    with config.overriding_provider(provider):
        yield provider
