"""Real races on DynamoDB: 8 OS processes, each with its own client, against moto's server.

The serialized endpoint runs one request at a time, as DynamoDB applies writes to an item; there
the provider must never let two owners overlap, never hand out a token that is not above the
last one, and never let an outsider in during a chain of transfers. Against raw moto, whose
conditional writes are not atomic, the same checker must find violations: that is what shows it
can fail. Both servers run with a 1 µs interpreter switch interval so their request threads
interleave as much as possible; only the lock differs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from leaseguard.config import ProviderConfig
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.testing import DynamoDBServer
from tests.race import lease_race, transfer_race

pytestmark = pytest.mark.slow

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
SWITCH_INTERVAL_S = 1e-6
# moto serves ~140 requests/s on the 2-core machine: make test runs the races on the serialized
# endpoint at this fraction of their full size (the same checks, fewer cycles), make soak at full
# size (LEASEGUARD_SOAK=1). The raw-moto race keeps 40%: it must still catch moto's double wins.
SOAK = os.environ.get("LEASEGUARD_SOAK") == "1"
SCALE = 1.0 if SOAK else 0.25
ATTEMPTS = round(150 * SCALE)  # per worker, on the serialized endpoint
RAW_ATTEMPTS = round(100 * (1.0 if SOAK else 0.4))  # per worker, on raw moto
TRANSFERS = round(100 * SCALE)


@pytest.fixture(scope="module", autouse=True)
def aws_env() -> Iterator[None]:
    # Race workers are forked from this process and inherit its environment.
    with pytest.MonkeyPatch.context() as patch:
        for name, value in AWS_ENV.items():
            patch.setenv(name, value)
        yield


def _config(server: DynamoDBServer) -> ProviderConfig:
    table = f"races-{uuid.uuid4().hex[:8]}"
    DynamoDBLeaseProvider(
        table, endpoint_url=server.endpoint_url, region_name="us-east-1"
    ).create_table()
    return ProviderConfig(
        backend="dynamodb",
        table_name=table,
        dynamodb_endpoint=server.endpoint_url,
        region_name="us-east-1",
    )


@pytest.fixture(scope="module")
def serialized(aws_env: None) -> Iterator[DynamoDBServer]:
    with DynamoDBServer(serialized=True, switch_interval_s=SWITCH_INTERVAL_S) as server:
        yield server


@pytest.fixture(scope="module")
def raw(aws_env: None) -> Iterator[DynamoDBServer]:
    with DynamoDBServer(serialized=False, switch_interval_s=SWITCH_INTERVAL_S) as server:
        yield server


def test_lease_race_on_the_serialized_endpoint_has_no_violation(
    serialized: DynamoDBServer,
) -> None:
    report = lease_race(_config(serialized), processes=8, attempts=ATTEMPTS, keys=4, hold_s=0.001)
    assert report.errors == []
    assert report.wins > 0 and report.refusals > 0  # the workers really competed
    assert report.overlaps == 0
    assert report.token_regressions == 0


def test_transfer_race_on_the_serialized_endpoint_lets_no_outsider_in(
    serialized: DynamoDBServer,
) -> None:
    report, outsider_attempts = transfer_race(_config(serialized), outsiders=7, transfers=TRANSFERS)
    assert report.errors == []
    assert outsider_attempts > TRANSFERS  # the outsiders really hammered the key
    assert report.transfers == TRANSFERS
    assert report.failed_transfers == 0
    assert report.outsider_wins == 0


def test_the_checker_catches_raw_moto(raw: DynamoDBServer) -> None:
    """Without the lock, moto lets two clients pass the same condition: the checker sees two
    owners at once or a token handed out twice."""
    report = lease_race(_config(raw), processes=8, attempts=RAW_ATTEMPTS, keys=2, hold_s=0.001)
    assert report.errors == []
    assert report.overlaps + report.token_regressions > 0
