"""The client and the table: building a client, and creating the table (requests a deployed
function never makes: stacks create the table themselves, ``docs/dynamodb.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from leaseguard import aws
from leaseguard.errors import ConfigurationError, LeaseBackendError, extra_required

from .io import Table, error_code
from .schema import DEAD_LETTER_INDEX, DEFAULT_MAX_ATTEMPTS, ORPHAN_INDEX

if TYPE_CHECKING:
    from botocore.config import Config
    from mypy_boto3_dynamodb import DynamoDBClient


def create_table(table: Table, *, wait: bool = True) -> bool:
    """Create the table (on-demand billing, the ``orphans`` and ``dead_letters`` GSIs) and
    enable TTL on ``ttl``. Idempotent: an existing table is checked for the indexes and left
    as it is. Whether this call created it."""
    client = table.client
    created = True
    try:
        client.create_table(
            TableName=table.name,
            BillingMode="PAY_PER_REQUEST",
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
                {"AttributeName": "gp", "AttributeType": "S"},
                {"AttributeName": "gx", "AttributeType": "N"},
                {"AttributeName": "gd", "AttributeType": "S"},
            ],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": ORPHAN_INDEX,
                    "KeySchema": [
                        {"AttributeName": "gp", "KeyType": "HASH"},
                        {"AttributeName": "gx", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
                {
                    "IndexName": DEAD_LETTER_INDEX,
                    "KeySchema": [{"AttributeName": "gd", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
            ],
        )
    except table.client_error as exc:
        if error_code(exc) != "ResourceInUseException":
            raise LeaseBackendError(f"cannot create table {table.name!r}: {exc}") from exc
        created = False
    except table.botocore_error as exc:
        raise LeaseBackendError(f"cannot create table {table.name!r}: {exc}") from exc
    try:
        if wait:
            client.get_waiter("table_exists").wait(
                TableName=table.name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
            )
        description = client.describe_table(TableName=table.name)["Table"]
        indexes = {i["IndexName"] for i in description.get("GlobalSecondaryIndexes", [])}
        for index in (ORPHAN_INDEX, DEAD_LETTER_INDEX):
            if index not in indexes:
                raise ConfigurationError(
                    f"table {table.name!r} exists without the {index!r} index "
                    "(see docs/dynamodb.md for the schema)"
                )
        ttl = client.describe_time_to_live(TableName=table.name)
        status = ttl.get("TimeToLiveDescription", {}).get("TimeToLiveStatus")
        if status not in ("ENABLED", "ENABLING"):
            client.update_time_to_live(
                TableName=table.name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"},
            )
    except (table.client_error, table.botocore_error) as exc:
        raise LeaseBackendError(f"cannot set up table {table.name!r}: {exc}") from exc
    return created


def build_client(
    endpoint_url: str | None, region_name: str | None, retry_config: Config | None
) -> DynamoDBClient:
    """A client from the process's shared boto3 session: standard retries (4 attempts in all)
    and short timeouts, merged with ``retry_config``."""
    with extra_required("dynamodb", "the DynamoDB provider"):
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

    config = Config(
        retries={"mode": "standard", "total_max_attempts": DEFAULT_MAX_ATTEMPTS},
        connect_timeout=2,
        read_timeout=5,
        tcp_keepalive=True,
    )
    if retry_config is not None:
        config = config.merge(retry_config)
    try:
        return cast(
            "DynamoDBClient",
            aws.client(
                "dynamodb", endpoint_url=endpoint_url, region_name=region_name, config=config
            ),
        )
    except BotoCoreError as exc:
        raise ConfigurationError(f"cannot build a DynamoDB client: {exc}") from exc
