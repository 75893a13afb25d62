"""The fallback when nothing can lease: every caller wins, everything else is inert.

This keeps single-process behaviour (each invocation runs its own event) when no backend is
configured. It coordinates nothing: two concurrent invocations both "own" the key. Tokens are
always ``0``.
"""

from __future__ import annotations

from leaseguard.protocol.model import Failure
from leaseguard.types import KeyState, LeaseResult, Signal

from .base import BaseLeaseProvider


class NoopLeaseProvider(BaseLeaseProvider):
    """Always acquires; release, renew and transfer do nothing (renew and transfer report
    success, since nobody else can hold the key). Arguments are still validated, so code that
    works against the no-op provider does not start failing on a real backend."""

    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return LeaseResult(acquired=True, owner=owner, token=0)

    def _get_owner(self, key: str) -> str | None:
        return None

    def _release(self, key: str, owner: str) -> None:
        return None

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        return True

    def _transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return True

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        return LeaseResult(acquired=True, owner=signal.id, token=0)

    def _take(
        self,
        key: str,
        owner: str,
        limit: int,
        token: int | None = None,
        completed: tuple[str, ...] = (),
    ) -> list[Signal]:
        return []

    def _transfer_to_next(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        claim: bool,
        token: int | None = None,
        failure: Failure | None = None,
    ) -> Signal | None:
        return None

    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        return None

    def _pending(self, key: str) -> int:
        return 0

    def _adopt(self, ttl_ms: int, limit: int, claim: bool) -> list[tuple[str, Signal]]:
        return []

    def _inspect(self, key: str) -> KeyState:
        return KeyState(key=key, owner=None, token=None, remaining_ms=None, queued=(), in_flight=())

    def _redrive(self, key: str, ids: tuple[str, ...] | None) -> int:
        return 0  # nothing is ever dead-lettered here

    def _dead_letter_keys(self, limit: int) -> list[str]:
        return []
