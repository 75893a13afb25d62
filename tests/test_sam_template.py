"""template.yaml, samconfig.toml and events/ read as data: least privilege, the lease table's
schema, and the settings the SAM application promises (``make sam-validate`` lints the
template, ``make sam-build`` builds it)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

ROOT = Path(__file__).resolve().parent.parent
GUARDED_SERVICES = ("dynamodb:", "lambda:", "sqs:")
_FUNCTION_ARN = re.compile(
    r"arn:\$\{AWS::Partition\}:lambda:\$\{AWS::Region\}:\$\{AWS::AccountId\}:function:(.+?)(:\*)?"
)


class CfnLoader(yaml.SafeLoader):
    """PyYAML with CloudFormation's short-form tags (``!Ref``, ``!GetAtt``, ``!Sub``...) read
    as their long forms (``{"Ref": ...}``, ``{"Fn::GetAtt": [...]}``...)."""


def _construct(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "Condition":
        return {"Condition": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _construct)


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    loaded = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=CfnLoader)
    assert isinstance(loaded, dict)
    return loaded


def _functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: resource["Properties"]
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Serverless::Function"
    }


def _branches(policy: Any) -> list[Any]:
    """A policy, or both branches of an ``Fn::If`` around it (``AWS::NoValue`` dropped)."""
    if isinstance(policy, dict) and set(policy) == {"Fn::If"}:
        _, yes, no = policy["Fn::If"]
        return [p for branch in (yes, no) for p in _branches(branch)]
    if policy == {"Ref": "AWS::NoValue"}:
        return []
    return [policy]


def _names_own_resource(value: Any, own: set[str], function_names: set[str]) -> bool:
    """Whether a resource expression points at a resource of this template: a ``Ref`` or
    ``Fn::GetAtt`` of one, or an ``Fn::Sub`` ARN of one of its functions' explicit names."""
    if isinstance(value, dict) and "Ref" in value:
        return value["Ref"] in own
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return value["Fn::GetAtt"][0] in own
    if isinstance(value, dict) and "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
        match = _FUNCTION_ARN.fullmatch(value["Fn::Sub"])
        return match is not None and match.group(1) in function_names
    return False


def test_policies_grant_dynamodb_lambda_and_sqs_only_on_the_stacks_own_resources(
    template: dict[str, Any],
) -> None:
    own = set(template["Resources"])
    functions = _functions(template)
    function_names = {
        props["FunctionName"]["Fn::Sub"] for props in functions.values() if "FunctionName" in props
    }
    checked = 0
    for name, props in functions.items():
        for policy in (p for entry in props.get("Policies", []) for p in _branches(entry)):
            assert isinstance(policy, dict), f"{name}: managed policy {policy!r} is not scoped"
            if "Statement" not in policy:
                # A SAM policy template: every argument must name one of our resources.
                ((template_name, arguments),) = policy.items()
                assert template_name in ("DynamoDBCrudPolicy", "DynamoDBReadPolicy")
                for argument in arguments.values():
                    assert _names_own_resource(argument, own, function_names), (name, policy)
                checked += 1
                continue
            for statement in policy["Statement"]:
                actions = statement["Action"]
                actions = [actions] if isinstance(actions, str) else actions
                if not any(a.startswith(GUARDED_SERVICES) for a in actions):
                    continue
                assert all("*" not in a for a in actions), statement  # no action wildcards
                resources = statement["Resource"]
                resources = resources if isinstance(resources, list) else [resources]
                assert "*" not in resources, statement
                for resource in resources:
                    assert _names_own_resource(resource, own, function_names), (name, resource)
                checked += 1
        destination = props.get("EventInvokeConfig", {}).get("DestinationConfig", {})
        for target in destination.values():
            assert _names_own_resource(target["Destination"], own, function_names)
    assert checked >= 5


def test_the_worker_invokes_itself_by_its_explicit_name(template: dict[str, Any]) -> None:
    worker = _functions(template)["ThreadWorkerFunction"]
    name = worker["FunctionName"]["Fn::Sub"]
    statements = [s for p in worker["Policies"] if "Statement" in p for s in p["Statement"]]
    invoke = [s for s in statements if s["Action"] == "lambda:InvokeFunction"]
    assert [r["Fn::Sub"].split(":function:")[1] for r in invoke[0]["Resource"]] == [
        name,
        f"{name}:*",  # a qualified ARN (alias or version) in context.invoked_function_arn
    ]
    assert "ThreadWorkerFunction" not in json.dumps(worker["Policies"])  # no self-reference
    assert worker["RecursiveLoop"] == "Allow"
    assert worker["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]["Type"] == "SQS"
    assert worker["Events"]["PostMessage"]["Properties"] == {
        "Path": "/threads/{threadId}/messages",
        "Method": "POST",
    }


class _RecordingClient:
    """Just enough of a boto3 DynamoDB client for create_table() to run against."""

    def __init__(self) -> None:
        self.calls: dict[str, dict[str, Any]] = {}

    def __getattr__(self, operation: str) -> Any:
        def call(**params: Any) -> Any:
            self.calls[operation] = params
            if operation == "describe_table":
                indexes = self.calls["create_table"]["GlobalSecondaryIndexes"]
                return {"Table": {"GlobalSecondaryIndexes": indexes}}
            if operation == "describe_time_to_live":
                return {"TimeToLiveDescription": {"TimeToLiveStatus": "DISABLED"}}
            return {}

        return call

    def get_waiter(self, name: str) -> Any:
        return self


def test_the_lease_table_is_the_one_create_table_creates(template: dict[str, Any]) -> None:
    client = _RecordingClient()
    DynamoDBLeaseProvider("leaseguard", client=client).create_table()  # type: ignore[arg-type]
    created = client.calls["create_table"]
    resource = template["Resources"]["LeaseTable"]
    table = resource["Properties"]
    assert resource["Condition"] == "UseDynamoDB"
    for field in ("BillingMode", "KeySchema", "AttributeDefinitions", "GlobalSecondaryIndexes"):
        assert table[field] == created[field], field
    ttl = client.calls["update_time_to_live"]["TimeToLiveSpecification"]
    assert table["TimeToLiveSpecification"] == ttl
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    conversations = template["Resources"]["ConversationTable"]["Properties"]
    assert conversations["BillingMode"] == "PAY_PER_REQUEST"
    assert conversations["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"]


def test_globals_parameters_and_outputs(template: dict[str, Any]) -> None:
    function = template["Globals"]["Function"]
    assert function["Runtime"] == "python3.12"
    assert function["Architectures"] == ["arm64"]
    assert function["Tracing"] == "Active"
    variables = function["Environment"]["Variables"]
    for name in ("POWERTOOLS_SERVICE_NAME", "POWERTOOLS_LOG_LEVEL", "POWERTOOLS_METRICS_NAMESPACE"):
        assert variables[name]
    assert variables["LEASEGUARD_BACKEND"] == {"Ref": "LeaseBackend"}
    assert variables["LEASEGUARD_TTL_MS"] == {"Ref": "LeaseTtlMs"}
    parameters = template["Parameters"]
    assert parameters["LeaseBackend"]["Default"] == "dynamodb"
    assert parameters["LeaseBackend"]["AllowedValues"] == ["dynamodb", "redis"]
    assert parameters["RedisUrl"]["NoEcho"] is True
    assert set(template["Conditions"]) >= {"UseDynamoDB", "UseRedis", "RedisInVpc"}
    assert set(template["Outputs"]) >= {
        "ApiUrl",
        "ThreadWorkerFunctionName",
        "SweeperFunctionName",
        "ConversationTableName",
        "LeaseTableName",
    }
    layer = template["Resources"]["LeaseguardLayer"]
    assert layer["Metadata"] == {"BuildMethod": "python3.12", "BuildArchitecture": "arm64"}
    requirements = (ROOT / layer["Properties"]["ContentUri"] / "requirements.txt").read_text()
    assert ".[dynamodb,redis,powertools]" in requirements.splitlines()


def test_samconfig() -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    assert config["version"] == 0.1
    assert config["default"]["validate"]["parameters"]["lint"] is True
    assert "build" in config["default"]
    deploy = config["default"]["deploy"]["parameters"]
    assert deploy["capabilities"] == "CAPABILITY_IAM"
    assert "LeaseBackend=" in deploy["parameter_overrides"]


def test_sample_events_match_the_template(template: dict[str, Any]) -> None:
    events = ROOT / "events"
    api = json.loads((events / "thread_worker" / "api_post_message.json").read_text())
    route = template["Resources"]["ThreadWorkerFunction"]["Properties"]["Events"]["PostMessage"]
    assert api["version"] == "2.0"
    assert api["routeKey"] == f"POST {route['Properties']['Path']}"
    assert json.loads(api["body"])["text"]
    assert int(api["headers"]["content-length"]) == len(api["body"].encode())
    envelope = json.loads((events / "thread_worker" / "handoff_envelope.json").read_text())
    assert set(envelope["leaseguard_handoff"]) >= {"version", "key", "owner", "token"}
    schedule = json.loads((events / "sweeper" / "schedule.json").read_text())
    assert schedule["detail-type"] == "Scheduled Event"
