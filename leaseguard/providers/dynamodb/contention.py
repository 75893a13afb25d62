"""How an optimistic step retries when other writers changed the key's item between its read
and its conditional write: a few tries at once, then random pauses, then an error."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

from leaseguard.errors import LeaseBackendError

from .schema import OPTIMISTIC_ATTEMPTS, Lease

# A step refused because another writer changed the item between its read and its write tries
# again at once this many times; before each later try it waits a random pause, up to a bound
# that doubles from _PAUSE_S to _MAX_PAUSE_S. Writers that keep colliding in step (forwarders
# and owners on one hot key, where the key flips between held and free under every read) then
# spread out, as AWS advises for retries (exponential backoff with jitter). The 32 tries of a
# step wait 1.7 s in all at most.
IMMEDIATE_TRIES = 3
_PAUSE_S = 0.004
_MAX_PAUSE_S = 0.064


def optimistic_tries() -> Iterator[int]:
    """The tries of one optimistic step (``OPTIMISTIC_ATTEMPTS`` in all), numbered from 0;
    from try ``IMMEDIATE_TRIES`` on, each starts after a random pause."""
    for attempt in range(OPTIMISTIC_ATTEMPTS):
        if attempt >= IMMEDIATE_TRIES:
            bound = min(_MAX_PAUSE_S, _PAUSE_S * 2 ** (attempt - IMMEDIATE_TRIES))
            time.sleep(random.uniform(bound / 2, bound))
        yield attempt


def unsettled(step: str, key: str, lease: Lease | None) -> LeaseBackendError:
    """The error of a step whose every try was refused, with the item as last seen."""
    seen = "" if lease is None else f"; the item as last seen: {lease.summary()}"
    return LeaseBackendError(
        f"{step} on {key!r} did not settle: other writers changed the key's item before each of"
        f" {OPTIMISTIC_ATTEMPTS} conditional writes{seen}"
    )
