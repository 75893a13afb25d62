"""A DynamoDB table that does not exist, met inside a guarded handler: one typed error that
names the table, where it was looked for and how to create it (it was a botocore
``ResourceNotFoundException``, "Requested resource not found", at the end of a long traceback).
The CLI words the same failure from the same error."""

from __future__ import annotations

import traceback
import uuid
from typing import Any

import pytest

from leaseguard import lease_owned
from leaseguard.cli import main
from leaseguard.errors import LeaseBackendError, TableNotFound
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.testing import DynamoDBServer, LambdaContext


@lease_owned(key_fn="k")
def handler(event: dict[str, Any], context: Any) -> str:
    return "ran"


def test_a_guarded_handler_names_the_missing_table_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, leaseguard_dynamodb_server: DynamoDBServer
) -> None:
    table = f"lgt-missing-{uuid.uuid4().hex[:8]}"
    endpoint = leaseguard_dynamodb_server.endpoint_url
    monkeypatch.setenv("LEASEGUARD_BACKEND", "dynamodb")
    monkeypatch.setenv("LEASEGUARD_TABLE_NAME", table)
    monkeypatch.setenv("LEASEGUARD_DYNAMODB_ENDPOINT", endpoint)
    with pytest.raises(TableNotFound) as raised:
        handler({"k": "key-1"}, LambdaContext(function_arn=""))
    error = raised.value
    assert isinstance(error, LeaseBackendError)  # what an `except LeaseBackendError` expects
    assert (error.table, error.where) == (table, endpoint)
    last_line = traceback.format_exception_only(error)[-1]
    assert f"DynamoDB table {table!r} does not exist at {endpoint}" in last_line
    assert "leaseguard create-table" in last_line and "template.yaml" in last_line


def test_a_provider_on_aws_names_the_region(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    for name, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        provider = DynamoDBLeaseProvider("lgt-nowhere", region_name="eu-west-1")
        with pytest.raises(TableNotFound) as raised:
            provider.acquire_lease("k", "me", 10_000)
    assert raised.value.where == "region eu-west-1"
    assert "'lgt-nowhere' does not exist at region eu-west-1" in str(raised.value)


def test_the_cli_says_the_same_with_its_own_fix(
    capsys: pytest.CaptureFixture[str], leaseguard_dynamodb_server: DynamoDBServer
) -> None:
    endpoint = leaseguard_dynamodb_server.endpoint_url
    code = main(["inspect", "k", "--dynamodb-endpoint", endpoint, "--table", "lgt-absent"])
    line = capsys.readouterr().err.strip()
    assert code == 2
    assert line.startswith("leaseguard inspect: error: DynamoDB table 'lgt-absent' does not exist")
    assert f"at {endpoint}: check --table or LEASEGUARD_TABLE_NAME" in line
