"""The provider class: validates its options and runs each step of the contract against its
:class:`~.io.Table` (the steps are in :mod:`.leases`, :mod:`.enqueue`, :mod:`.take`,
:mod:`.adopt` and :mod:`.dead_letters`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from leaseguard.errors import InvalidLeaseArgument
from leaseguard.protocol.model import DEAD_LIMIT, DEFAULT_MAX_QUEUE, Failure
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.types import KeyState, LeaseResult, Signal, now_ms
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES, check_positive_int

from . import admin, adopt, dead_letters, enqueue, leases, take
from .io import Table
from .schema import (
    DEFAULT_CLOCK_SKEW_MS,
    DEFAULT_ORPHAN_SHARDS,
    DEFAULT_RETENTION_S,
    DYNAMODB_MAX_PAYLOAD_BYTES,
)

if TYPE_CHECKING:
    from botocore.config import Config
    from mypy_boto3_dynamodb import DynamoDBClient


class DynamoDBLeaseProvider(BaseLeaseProvider):
    """The lease contract and signal queue on one DynamoDB table.

    ``client`` is a boto3 DynamoDB client; without one, a client is built with ``endpoint_url``,
    ``region_name`` and a botocore ``Config`` (standard retries, short timeouts) merged with
    ``retry_config``. ``clock`` returns the caller's epoch milliseconds (tests inject skewed
    clocks). Create the table with :meth:`create_table` or the schema in ``docs/dynamodb.md``.

    >>> provider = DynamoDBLeaseProvider("leaseguard")  # doctest: +SKIP
    >>> provider.acquire_lease("thread:42", "req-1", 15_000)  # doctest: +SKIP
    LeaseResult(acquired=True, owner='req-1', token=1732880000123457, ...)
    """

    atomic_transfer: ClassVar[bool] = True

    def __init__(
        self,
        table_name: str,
        client: DynamoDBClient | None = None,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_queue: int = DEFAULT_MAX_QUEUE,
        clock: Callable[[], int] | None = None,
        retry_config: Config | None = None,
        retention_s: int = DEFAULT_RETENTION_S,
        orphan_shards: int = DEFAULT_ORPHAN_SHARDS,
        dead_limit: int = DEAD_LIMIT,
    ) -> None:
        super().__init__(
            max_payload_bytes=max_payload_bytes, max_queue=max_queue, dead_limit=dead_limit
        )
        if not isinstance(table_name, str) or not 3 <= len(table_name) <= 255:
            raise InvalidLeaseArgument("table_name must be a str of 3 to 255 characters")
        if isinstance(clock_skew_ms, bool) or not isinstance(clock_skew_ms, int):
            raise InvalidLeaseArgument("clock_skew_ms must be an int")
        if not 0 <= clock_skew_ms <= 3_600_000:
            raise InvalidLeaseArgument("clock_skew_ms must be between 0 and one hour")
        self.retention_s = check_positive_int("retention_s", retention_s, 366 * 86_400)
        if self.retention_s * 1000 < 60 * clock_skew_ms:
            # Token floors after a TTL deletion rely on retention being far above the skew.
            raise InvalidLeaseArgument("retention_s must be at least 60 times clock_skew_ms")
        self.orphan_shards = check_positive_int("orphan_shards", orphan_shards, 1000)
        self.table_name = table_name
        self.clock_skew_ms = clock_skew_ms
        self._table = Table(
            table_name,
            client or admin.build_client(endpoint_url, region_name, retry_config),
            clock or now_ms,
            clock_skew_ms,
            self.retention_s,
            self.orphan_shards,
            self.dead_limit,
        )

    @property
    def client(self) -> DynamoDBClient:
        """The boto3 client every request goes through."""
        return self._table.client

    @client.setter
    def client(self, client: DynamoDBClient) -> None:
        self._table.client = client

    @classmethod
    def _payload_ceiling(cls) -> int:
        return DYNAMODB_MAX_PAYLOAD_BYTES

    def create_table(self, *, wait: bool = True) -> bool:
        """Create the table (on-demand billing, the ``orphans`` and ``dead_letters`` GSIs) and
        enable TTL on ``ttl``. Idempotent: an existing table is checked for the indexes and
        left as it is.

        Returns
        -------
        bool
            Whether this call created the table (False: it existed already)."""
        return admin.create_table(self._table, wait=wait)

    # -- the contract ---------------------------------------------------------------------------

    def _acquire(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return leases.acquire(self._table, key, owner, ttl_ms)

    def _get_owner(self, key: str) -> str | None:
        return leases.get_owner(self._table, key)

    def _release(self, key: str, owner: str) -> None:
        leases.release(self._table, key, owner)

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        return leases.renew(self._table, key, owner, ttl_ms, token)

    def _transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return leases.transfer(self._table, key, from_owner, to_owner, ttl_ms)

    # -- the signal queue -----------------------------------------------------------------------

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        return enqueue.acquire_or_enqueue(self._table, key, signal, record, ttl_ms, max_queue)

    def _take(
        self,
        key: str,
        owner: str,
        limit: int,
        token: int | None = None,
        completed: tuple[str, ...] = (),
    ) -> list[Signal]:
        return take.take(self._table, key, owner, limit, token, completed)

    def _transfer_to_next(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        claim: bool,
        token: int | None = None,
        failure: Failure | None = None,
    ) -> Signal | None:
        return take.transfer_to_next(self._table, key, owner, ttl_ms, claim, token, failure)

    def _claim(self, key: str, owner: str, token: int, ttl_ms: int) -> Signal | None:
        return adopt.claim(self._table, key, owner, token, ttl_ms)

    def _pending(self, key: str) -> int:
        return len(self._table.read(key).queue)

    def _adopt(self, ttl_ms: int, limit: int, claim: bool) -> list[tuple[str, Signal]]:
        return adopt.adopt(self._table, ttl_ms, limit, claim)

    def _redrive(self, key: str, ids: tuple[str, ...] | None) -> int:
        return dead_letters.redrive(self._table, key, ids)

    def _dead_letter_keys(self, limit: int) -> list[str]:
        return dead_letters.dead_letter_keys(self._table, limit)

    def _inspect(self, key: str) -> KeyState:
        return dead_letters.inspect(self._table, key)
