"""template.yaml, samconfig.toml and events/ read as data: least privilege (each role grants
exactly the AWS requests its function's code makes, derived from leaseguard's source), the lease
table's schema, alarms, the API's throttling and authorization, and the settings the SAM
application promises (``make sam-validate`` lints the template, ``make sam-build`` builds it)."""

from __future__ import annotations

import ast
import functools
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from leaseguard.providers.dynamodb import ORPHAN_INDEX, DynamoDBLeaseProvider

ROOT = Path(__file__).resolve().parent.parent
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


# -- the requests the functions' code makes, read from the source -------------------------------

PROVIDER = ROOT / "leaseguard" / "providers" / "dynamodb"
BASE = ROOT / "leaseguard" / "providers" / "base.py"
GUARD = ROOT / "leaseguard" / "guard"
# The DynamoDB calls only create_table() makes: deployed stacks create the table themselves.
SETUP_ONLY = {"create_table", "describe_table", "describe_time_to_live", "update_time_to_live"}


def _tree(path: Path) -> ast.Module:
    if path.is_dir():
        return ast.Module(
            body=[n for f in sorted(path.glob("*.py")) for n in _tree(f).body], type_ignores=[]
        )
    return ast.parse(path.read_text(encoding="utf-8"))


def _methods(path: Path, class_name: str) -> dict[str, ast.FunctionDef]:
    (cls,) = [
        n for n in ast.walk(_tree(path)) if isinstance(n, ast.ClassDef) and n.name == class_name
    ]
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}


def _function(path: Path, name: str) -> ast.FunctionDef:
    (fn,) = [n for n in ast.walk(_tree(path)) if isinstance(n, ast.FunctionDef) and n.name == name]
    return fn


def _attributes_of(node: ast.AST, owner: str) -> set[str]:
    """``x`` for every ``owner.x`` in ``node`` (``owner`` dotted, as ``self.client``)."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) == owner:
            found.add(n.attr)
    return found


def _names_in(node: ast.AST) -> set[str]:
    """Every name and attribute ``node`` mentions: the functions it may call. A name that is
    only read an attribute off (``adopt.claim``: a module) is not a call of that name."""
    qualifiers = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in qualifiers} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _provider_functions() -> dict[str, list[ast.FunctionDef]]:
    """Every function and method of the base class and the DynamoDB package, by name."""
    functions: dict[str, list[ast.FunctionDef]] = {}
    for tree in (_tree(BASE), _tree(PROVIDER)):
        for n in ast.walk(tree):
            if isinstance(n, ast.FunctionDef):
                functions.setdefault(n.name, []).append(n)
    return functions


@functools.cache
def _dynamodb_operations() -> frozenset[str]:
    """The method names of a boto3 DynamoDB client (no request is made)."""
    import boto3

    client = boto3.session.Session().client("dynamodb", region_name="us-east-1")
    return frozenset(client.meta.method_to_api_mapping) | {"get_waiter"}


def _client_ops(node: ast.AST) -> set[str]:
    """The DynamoDB client operations ``node`` makes (``self.client.x``, ``client.x``)."""
    named = _attributes_of(node, "self.client") | _attributes_of(node, "client")
    return named & _dynamodb_operations()


def _reachable(entry_points: set[str]) -> set[str]:
    """The names of the provider's functions reachable from these public provider methods.
    A reference by name counts as a call: an over-approximation, so a grant can only be too
    wide here, never missing."""
    functions = _provider_functions()
    seen: set[str] = set()
    todo = list(entry_points)
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for fn in functions[name]:
            todo.extend(_names_in(fn))
    return seen


def _client_calls(entry_points: set[str]) -> set[str]:
    """The DynamoDB operations reachable from the given public provider methods."""
    functions = _provider_functions()
    return {
        op for name in _reachable(entry_points) for fn in functions[name] for op in _client_ops(fn)
    }


def _provider_methods_used(*nodes: ast.AST) -> set[str]:
    """The public provider methods (BaseLeaseProvider's) that these modules or functions use."""
    public = {m for m in _methods(BASE, "BaseLeaseProvider") if not m.startswith("_")}
    return {
        n.attr
        for node in nodes
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and n.attr in public
    }


def _action(operation: str) -> str:
    return "".join(part.title() for part in operation.split("_"))


SQS_POLLING = ("DeleteMessage", "GetQueueAttributes", "ReceiveMessage")


def _expected_grants() -> dict[str, set[tuple[str, str]]]:
    """(IAM action, resource) per function, derived from the source: the lease provider's
    client calls reachable from what the guard (worker) and ``dispatch_orphans`` (sweeper)
    call, the worker's own table calls, and the dispatchers' Lambda and SQS calls."""
    leaseguard = ROOT / "leaseguard"
    functions = _provider_functions()
    every_call = _client_ops(_tree(PROVIDER)) - {"get_waiter"}
    assert _client_ops(_function(PROVIDER / "admin.py", "create_table")) >= SETUP_ONLY
    config = _tree(leaseguard / "config.py")
    worker_uses = _provider_methods_used(
        _tree(GUARD), _tree(leaseguard / "renewal.py"), _tree(leaseguard / "renewer.py"), config
    )
    sweeper_uses = _provider_methods_used(
        _function(leaseguard / "handoff.py", "dispatch_orphans"), config
    )
    assert "create_table" not in worker_uses | sweeper_uses
    assert worker_uses >= {"acquire_or_enqueue", "transfer_to_next", "renew_lease"}, worker_uses
    assert "adopt_orphans" in sweeper_uses, sweeper_uses
    # Query goes through one function that takes the index; the functions' paths reach it only
    # through the orphans index (dead_letter_keys, on the dead_letters index, is the CLI's).
    (querying,) = [n for n, fns in functions.items() if any("query" in _client_ops(f) for f in fns)]
    assert "IndexName" in ast.unparse(functions[querying][0])
    reached = _reachable(worker_uses | sweeper_uses)
    callers = {
        n for n in reached if n != querying and any(querying in _names_in(f) for f in functions[n])
    }
    assert callers, querying
    assert all("ORPHAN_INDEX" in ast.unparse(f) for n in callers for f in functions[n]), callers
    assert "dead_letter_keys" not in reached

    def lease_table(calls: set[str]) -> set[tuple[str, str]]:
        assert calls <= every_call - SETUP_ONLY, calls
        index = f"LeaseTable/index/{ORPHAN_INDEX}"
        return {(f"dynamodb:{_action(c)}", index if c == "query" else "LeaseTable") for c in calls}

    worker_app = _tree(ROOT / "functions" / "thread_worker" / "app.py")
    conversation_calls = _attributes_of(worker_app, "conversations")
    assert conversation_calls == {"update_item"}, conversation_calls
    # The handoff goes by async Invoke of the worker itself: lease_owned has no queue_url, so
    # the guard never builds an SqsDispatcher.
    (guarded,) = [
        d
        for n in ast.walk(worker_app)
        if isinstance(n, ast.FunctionDef)
        for d in n.decorator_list
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "lease_owned"
    ]
    assert "queue_url" not in {k.arg for k in guarded.keywords}
    # The batch worker: the same appends (app.append), its records guarded the same way.
    batch_app = _tree(ROOT / "functions" / "thread_worker" / "batch.py")
    assert "append" in {
        a.name
        for n in ast.walk(batch_app)
        if isinstance(n, ast.ImportFrom) and n.module == "app"
        for a in n.names
    }
    (batch_guarded,) = [
        d
        for n in ast.walk(batch_app)
        if isinstance(n, ast.FunctionDef)
        for d in n.decorator_list
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "lease_owned"
    ]
    assert "queue_url" not in {k.arg for k in batch_guarded.keywords}
    assert _attributes_of(batch_app, "conversations") == set()
    # The sweeper: leaseguard.sweeper's handler, whose dispatcher is an SQS queue only when
    # LEASEGUARD_HANDOFF_QUEUE_URL is set (the template sets the worker's name instead).
    sweeper_app = (ROOT / "functions" / "sweeper" / "app.py").read_text(encoding="utf-8")
    assert "sweeper_handler()" in sweeper_app
    loaded = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=CfnLoader)
    sweeper_env = loaded["Resources"]["SweeperFunction"]["Properties"]["Environment"]
    assert set(sweeper_env["Variables"]) == {"LEASEGUARD_WORKER_FUNCTION"}
    dispatch = _function(leaseguard / "sweeper.py", "_dispatcher")
    assert {"InvokeDispatcher", "SqsDispatcher"} <= _names_in(dispatch)
    invoke = _methods(leaseguard / "handoff.py", "InvokeDispatcher")
    assert _attributes_of(invoke["dispatch"], "self.client") == {"invoke"}
    # Lambda itself sends a failed async invocation to the on-failure destination, as the
    # function's role.
    on_failure = ("sqs:SendMessage", "FailedInvocationsQueue")
    return {
        "ThreadWorkerFunction": lease_table(_client_calls(worker_uses))
        | {(f"dynamodb:{_action(c)}", "ConversationTable") for c in conversation_calls}
        | {("lambda:InvokeFunction", "ThreadWorkerFunction"), on_failure},
        "BatchWorkerFunction": lease_table(_client_calls(worker_uses))
        | {(f"dynamodb:{_action(c)}", "ConversationTable") for c in conversation_calls}
        | {("lambda:InvokeFunction", "BatchWorkerFunction"), on_failure}
        # What Lambda's SQS event source mapping does as the function (the managed policy
        # AWSLambdaSQSQueueExecutionRole's SQS actions), on this function's queue only.
        | {(f"sqs:{a}", "MessagesQueue") for a in SQS_POLLING},
        "SweeperFunction": lease_table(_client_calls(sweeper_uses))
        | {("lambda:InvokeFunction", "ThreadWorkerFunction"), on_failure},
    }


# -- the template, with its conditions decided ----------------------------------------------


def _decide(value: Any, conditions: dict[str, bool]) -> Any:
    """``value`` with every ``Fn::If`` decided and ``AWS::NoValue`` removed."""
    no_value = object()

    def walk(v: Any) -> Any:
        if isinstance(v, dict) and set(v) == {"Fn::If"}:
            name, yes, no = v["Fn::If"]
            return walk(yes if conditions[name] else no)
        if v == {"Ref": "AWS::NoValue"}:
            return no_value
        if isinstance(v, dict):
            return {k: w for k, w in ((k, walk(x)) for k, x in v.items()) if w is not no_value}
        if isinstance(v, list):
            return [w for w in (walk(x) for x in v) if w is not no_value]
        return v

    return walk(value)


SETTINGS = {
    "dynamodb": {"UseDynamoDB": True, "UseRedis": False, "RedisInVpc": False},
    "redis": {"UseDynamoDB": False, "UseRedis": True, "RedisInVpc": False},
    "redis in a VPC": {"UseDynamoDB": False, "UseRedis": True, "RedisInVpc": True},
}


def _role(template: dict[str, Any], function: str) -> dict[str, Any]:
    role = _functions(template)[function]["Role"]
    assert set(role) == {"Fn::GetAtt"} and role["Fn::GetAtt"][1] == "Arn", role
    resource = template["Resources"][role["Fn::GetAtt"][0]]
    assert resource["Type"] == "AWS::IAM::Role"
    return dict(resource["Properties"])


def _target(resource: Any, template: dict[str, Any]) -> str:
    """The logical id of this template's resource that an IAM ``Resource`` names, with an index
    suffix for a DynamoDB index; fails for anything else."""
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        name, attribute = resource["Fn::GetAtt"]
        assert attribute == "Arn" and name in template["Resources"], resource
        return str(name)
    assert isinstance(resource, dict) and isinstance(resource.get("Fn::Sub"), str), resource
    text = resource["Fn::Sub"]
    index = re.fullmatch(r"\$\{(\w+)\.Arn\}(/index/\w+)", text)
    if index:
        return index.group(1) + index.group(2)
    match = _FUNCTION_ARN.fullmatch(text)
    assert match, text
    (function,) = [
        name
        for name, props in _functions(template).items()
        if props.get("FunctionName") == {"Fn::Sub": match.group(1)}
    ]
    return function


def _granted(template: dict[str, Any], function: str, setting: str) -> set[tuple[str, str]]:
    role = _decide(_role(template, function), SETTINGS[setting])
    grants = set()
    for policy in role["Policies"]:
        for statement in policy["PolicyDocument"]["Statement"]:
            assert statement["Effect"] == "Allow" and set(statement) <= {
                "Sid",
                "Effect",
                "Action",
                "Resource",
            }, statement
            actions = statement["Action"]
            actions = [actions] if isinstance(actions, str) else actions
            resources = statement["Resource"]
            resources = resources if isinstance(resources, list) else [resources]
            assert all("*" not in a for a in actions), statement  # no action wildcards
            for action in actions:
                for resource in resources:
                    grants.add((action, _target(resource, template)))
    return grants


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize(
    "function", ["ThreadWorkerFunction", "BatchWorkerFunction", "SweeperFunction"]
)
def test_each_role_grants_exactly_the_requests_its_code_makes(
    template: dict[str, Any], function: str, setting: str
) -> None:
    expected = _expected_grants()[function]
    if not SETTINGS[setting]["UseDynamoDB"]:
        expected = {(a, r) for a, r in expected if not r.startswith("LeaseTable")}
    assert _granted(template, function, setting) == expected
    props = _functions(template)[function]
    assert "Policies" not in props  # the role above is the whole of it
    destination = props["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]
    assert destination == {
        "Type": "SQS",
        "Destination": {"Fn::GetAtt": ["FailedInvocationsQueue", "Arn"]},
    }


def test_the_expected_grants_are_what_the_docs_list() -> None:
    """A sanity check of the derivation itself (it must not come out empty or wider)."""
    grants = _expected_grants()
    assert {a for a, r in grants["ThreadWorkerFunction"] if r == "LeaseTable"} == {
        "dynamodb:BatchGetItem",
        "dynamodb:BatchWriteItem",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
    }
    assert {(a, r) for a, r in grants["SweeperFunction"] if r.startswith("LeaseTable")} == {
        ("dynamodb:BatchGetItem", "LeaseTable"),
        ("dynamodb:GetItem", "LeaseTable"),
        ("dynamodb:UpdateItem", "LeaseTable"),
        ("dynamodb:Query", "LeaseTable/index/orphans"),
    }


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_managed_policies_and_vpc_access_only_for_redis_in_a_vpc(
    template: dict[str, Any], setting: str
) -> None:
    arn = "arn:${AWS::Partition}:iam::aws:policy/"
    for function in ("ThreadWorkerFunction", "BatchWorkerFunction", "SweeperFunction"):
        role = _decide(_role(template, function), SETTINGS[setting])
        assert role["AssumeRolePolicyDocument"]["Statement"] == [
            {
                "Effect": "Allow",
                "Principal": {"Service": "lambda.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ]
        expected = [
            {"Fn::Sub": arn + "service-role/AWSLambdaBasicExecutionRole"},
            {"Fn::Sub": arn + "AWSXRayDaemonWriteAccess"},  # Tracing: Active
        ]
        if SETTINGS[setting]["RedisInVpc"]:
            expected.append({"Fn::Sub": arn + "service-role/AWSLambdaVPCAccessExecutionRole"})
        assert role["ManagedPolicyArns"] == expected
    in_vpc = template["Conditions"]["RedisInVpc"]["Fn::And"]
    assert {"Condition": "UseRedis"} in in_vpc
    vpc = template["Globals"]["Function"]["VpcConfig"]["Fn::If"]
    assert vpc[0] == "RedisInVpc" and vpc[2] == {"Ref": "AWS::NoValue"}


def test_the_worker_invokes_itself_by_its_explicit_name(template: dict[str, Any]) -> None:
    worker = _functions(template)["ThreadWorkerFunction"]
    name = worker["FunctionName"]["Fn::Sub"]
    role = _role(template, "ThreadWorkerFunction")
    statements = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
    invoke = [s for s in statements if s.get("Action") == "lambda:InvokeFunction"]
    assert [r["Fn::Sub"].split(":function:")[1] for r in invoke[0]["Resource"]] == [
        name,
        f"{name}:*",  # a qualified ARN (alias or version) in context.invoked_function_arn
    ]
    assert "ThreadWorkerFunction" not in json.dumps(role)  # no circular dependency
    assert worker["RecursiveLoop"] == "Allow"
    assert worker["ReservedConcurrentExecutions"] == {
        "Fn::If": [
            "HasWorkerReservedConcurrency",
            {"Ref": "WorkerReservedConcurrency"},
            {"Ref": "AWS::NoValue"},
        ]
    }
    parameter = template["Parameters"]["WorkerReservedConcurrency"]
    assert parameter["Default"] == ""
    assert re.fullmatch(parameter["AllowedPattern"], "")
    assert re.fullmatch(parameter["AllowedPattern"], "20")
    assert not re.fullmatch(parameter["AllowedPattern"], "0")  # 0 would stop the function
    assert template["Conditions"]["HasWorkerReservedConcurrency"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "WorkerReservedConcurrency"}, ""]}]
    }


def test_the_api_route_throttling_and_authorization(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    route = resources["PostMessageRoute"]["Properties"]
    assert route["RouteKey"] == "POST /threads/{threadId}/messages"
    assert route["ApiId"] == {"Ref": "ChatApi"}
    assert route["Target"] == {"Fn::Sub": "integrations/${PostMessageIntegration}"}
    assert route["AuthorizationType"] == {"Ref": "ApiAuth"}
    auth = template["Parameters"]["ApiAuth"]
    # Safe by default: an open route is an explicit choice (sam local ignores AWS_IAM).
    assert auth["Default"] == "AWS_IAM" and auth["AllowedValues"] == ["AWS_IAM", "NONE"]
    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    overrides = config["default"]["deploy"]["parameters"]["parameter_overrides"]
    assert 'ApiAuth="AWS_IAM"' in overrides, overrides
    integration = resources["PostMessageIntegration"]["Properties"]
    assert integration["IntegrationUri"] == {
        "Fn::Sub": "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}"
        ":function:${ThreadWorkerFunction}"
    }
    assert integration["PayloadFormatVersion"] == "2.0"  # events/thread_worker/ is v2
    assert resources["ChatApi"]["Properties"]["ProtocolType"] == "HTTP"
    stage = resources["ChatApiStage"]["Properties"]
    assert stage["StageName"] == "$default" and stage["AutoDeploy"] is True
    assert stage["DefaultRouteSettings"] == {
        "ThrottlingBurstLimit": {"Ref": "ApiThrottlingBurstLimit"},
        "ThrottlingRateLimit": {"Ref": "ApiThrottlingRateLimit"},
    }
    for name in ("ApiThrottlingBurstLimit", "ApiThrottlingRateLimit"):
        parameter = template["Parameters"][name]
        assert parameter["Type"] == "Number"
        assert 1 <= parameter["MinValue"] <= parameter["Default"] <= parameter["MaxValue"]
    permission = resources["PostMessagePermission"]["Properties"]
    assert permission["FunctionName"] == {"Ref": "ThreadWorkerFunction"}
    assert permission["Principal"] == "apigateway.amazonaws.com"
    method, path = route["RouteKey"].split(" ")
    source = re.sub(r"\{\w+\}", "*", path)
    assert permission["SourceArn"]["Fn::Sub"].endswith(f":${{ChatApi}}/*/{method}{source}")
    assert template["Outputs"]["ApiUrl"]["Value"] == {"Fn::GetAtt": ["ChatApi", "ApiEndpoint"]}


def _emitted_metrics() -> set[str]:
    """The metric names leaseguard records, read from its source: every ``count("Name")`` and
    ``timing("Name")`` of its Telemetry (the guard, the sweeper's ``dispatch_orphans``, the
    helpers in observability.py)."""
    sources = [*sorted(GUARD.glob("*.py")), ROOT / "leaseguard" / "handoff.py"]
    sources.append(ROOT / "leaseguard" / "observability.py")
    names = set()
    for path in sources:
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("count", "timing")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names.add(node.args[0].value)
    return names


def _alarms(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: resource["Properties"]
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
    }


def test_alarms(template: dict[str, Any]) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    actions = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    alarms = _alarms(template)
    emitted = _emitted_metrics()
    assert {"LeaseAcquired", "QueueDepth", "QueueFull", "OldestQueuedAgeMs"} <= emitted, emitted
    # leaseguard's metrics: Powertools EMF, the namespace and a "service" dimension from the
    # environment; each alarm on a name the code records.
    own = {name: props for name, props in alarms.items() if props["Namespace"] != "AWS/Lambda"}
    by_metric = {props["MetricName"]: props for props in own.values()}
    assert set(by_metric) == {
        "ApproximateNumberOfMessagesVisible",
        "SignalDeadLettered",
        "SignalKeptHalted",
        "LeaseLost",
        "QueueFull",
        "QueueDepth",
        "OldestQueuedAgeMs",
    }
    for metric, alarm in by_metric.items():
        if metric == "ApproximateNumberOfMessagesVisible":
            continue
        assert metric in emitted, metric
        assert alarm["Namespace"] == variables["POWERTOOLS_METRICS_NAMESPACE"]
        assert alarm["Dimensions"] == [
            {"Name": "service", "Value": variables["POWERTOOLS_SERVICE_NAME"]}
        ]
    # Counts alarm on any at all; the depth and the age on their worst value over a minute,
    # above a threshold of their own.
    for metric in ("SignalDeadLettered", "SignalKeptHalted", "LeaseLost", "QueueFull"):
        assert by_metric[metric]["Statistic"] == "Sum" and by_metric[metric]["Threshold"] == 0
    thresholds = {"QueueDepth": "QueueDepthAlarmThreshold", "OldestQueuedAgeMs": "QueuedAgeAlarmMs"}
    for metric, parameter in thresholds.items():
        assert by_metric[metric]["Statistic"] == "Maximum"
        assert by_metric[metric]["Threshold"] == {"Ref": parameter}
        assert template["Parameters"][parameter]["Type"] == "Number"
    assert template["Parameters"]["QueueDepthAlarmThreshold"]["Default"] < 1000  # < max_queue
    queue = by_metric["ApproximateNumberOfMessagesVisible"]
    assert queue["Namespace"] == "AWS/SQS"
    assert queue["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["FailedInvocationsQueue", "QueueName"]}}
    ]
    # Lambda's own: errors and throttles of every function.
    lambda_alarms = {
        (props["Dimensions"][0]["Value"]["Ref"], props["MetricName"])
        for props in alarms.values()
        if props["Namespace"] == "AWS/Lambda"
    }
    functions = set(_functions(template))
    assert lambda_alarms == {(f, m) for f in functions for m in ("Errors", "Throttles")}
    for props in alarms.values():
        if props["Namespace"] == "AWS/Lambda":
            assert props["Dimensions"][0]["Name"] == "FunctionName"
            assert len(props["Dimensions"]) == 1 and props["Statistic"] == "Sum"
            assert props["Threshold"] == 0
    for alarm in alarms.values():
        assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"
        assert alarm["AlarmActions"] == actions and alarm["OKActions"] == actions
        assert alarm["AlarmDescription"]
    assert template["Parameters"]["AlarmTopicArn"]["Default"] == ""
    assert template["Conditions"]["HasAlarmTopic"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]
    }


def test_alarms_are_listed_in_docs_deploy_md(template: dict[str, Any]) -> None:
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = text.split("### Alarms", 1)[1].split("\n### ", 1)[0]
    for name in _alarms(template):
        assert f"`{name}`" in section, name
    for parameter in template["Parameters"]:
        assert f"`{parameter}`" in text, parameter


def test_each_function_logs_to_a_log_group_with_retention(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    retention = template["Parameters"]["LogRetentionInDays"]
    assert retention["Type"] == "Number" and retention["Default"] in retention["AllowedValues"]
    groups = set()
    for name, props in _functions(template).items():
        group = props["LoggingConfig"]["LogGroup"]["Ref"]
        groups.add(group)
        resource = resources[group]
        assert resource["Type"] == "AWS::Logs::LogGroup"
        assert resource["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionInDays"}
        # The name Lambda itself would give the function's group (console, sam logs), known
        # before the function exists: the function's explicit name.
        assert resource["Properties"]["LogGroupName"] == {
            "Fn::Sub": "/aws/lambda/" + props["FunctionName"]["Fn::Sub"]
        }, name
        assert resource["DeletionPolicy"] == resource["UpdateReplacePolicy"]
    assert len(groups) == len(_functions(template))
    assert {n for n, r in resources.items() if r["Type"] == "AWS::Logs::LogGroup"} == groups


def test_stateful_resources_say_what_happens_on_delete_and_replace(
    template: dict[str, Any],
) -> None:
    for name, resource in template["Resources"].items():
        if resource["Type"] in ("AWS::DynamoDB::Table", "AWS::SQS::Queue"):
            assert resource["DeletionPolicy"] == resource["UpdateReplacePolicy"], name
    assert template["Resources"]["ConversationTable"]["DeletionPolicy"] == "Retain"
    assert template["Resources"]["FailedInvocationsQueue"]["DeletionPolicy"] == "Retain"


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
    assert function["Architectures"] == [{"Ref": "Architecture"}]
    assert parameters_default(template, "Architecture") == "arm64"
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
    # Built by functions/layer/Makefile from pure-Python wheels: one layer for either
    # architecture (test_the_layer_is_what_the_runtime_lacks).
    assert layer["Metadata"] == {"BuildMethod": "makefile"}
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64", "x86_64"]
    assert template["Parameters"]["Architecture"]["AllowedValues"] == ["arm64", "x86_64"]


def parameters_default(template: dict[str, Any], name: str) -> Any:
    return template["Parameters"][name]["Default"]


def test_samconfig(template: dict[str, Any]) -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    assert config["version"] == 0.1
    assert config["default"]["validate"]["parameters"]["lint"] is True
    assert "build" in config["default"]
    deploy = config["default"]["deploy"]["parameters"]
    assert deploy["capabilities"] == "CAPABILITY_IAM"
    assert "LeaseBackend=" in deploy["parameter_overrides"]
    overridden = re.findall(r'(\w+)="[^"]*"', deploy["parameter_overrides"])
    assert set(overridden) <= set(template["Parameters"]), overridden


def test_sample_events_match_the_template(template: dict[str, Any]) -> None:
    events = ROOT / "events"
    api = json.loads((events / "thread_worker" / "api_post_message.json").read_text())
    route = template["Resources"]["PostMessageRoute"]["Properties"]
    assert api["version"] == "2.0"
    assert api["routeKey"] == route["RouteKey"]
    assert json.loads(api["body"])["text"]
    assert int(api["headers"]["content-length"]) == len(api["body"].encode())
    envelope = json.loads((events / "thread_worker" / "handoff_envelope.json").read_text())
    assert set(envelope["leaseguard_handoff"]) >= {"version", "key", "owner", "token"}
    schedule = json.loads((events / "sweeper" / "schedule.json").read_text())
    assert schedule["detail-type"] == "Scheduled Event"


# -- the layer and the functions' init ------------------------------------------------------

# The Lambda python3.12 runtime's own packages: boto3 and what it depends on (checked below
# against boto3's metadata, so this is not a copy that can go stale).
RUNTIME_SDK = {"boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3"}
COMPILED = {"hiredis"}  # compiled per architecture: left out of the pure-Python layer


def _closure(*requirements: str) -> dict[str, str]:
    """Every distribution these requirements install, by canonical name, with the specifier
    the first requirement naming it gave (read from .venv's installed metadata)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop(0)
        name = canonicalize_name(requirement.name)
        found.setdefault(name, str(requirement.specifier))
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        for line in metadata.distribution(name).requires or []:
            dependency = Requirement(line)
            extras = requirement.extras or {""}
            marker = dependency.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras):
                todo.append(dependency)
    return found


def test_the_layer_is_what_the_runtime_lacks(template: dict[str, Any]) -> None:
    """functions/layer/requirements.txt is the closure of leaseguard[redis,powertools] and
    Powertools' Tracer, less the runtime's SDK and hiredis; installed without dependencies
    (the Makefile), nothing else comes in."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    assert set(_closure("boto3")) == RUNTIME_SDK
    layer = template["Resources"]["LeaseguardLayer"]["Properties"]["ContentUri"]
    lines = (ROOT / layer / "requirements.txt").read_text(encoding="utf-8").splitlines()
    listed = {
        canonicalize_name(r.name): str(r.specifier)
        for r in (Requirement(line) for line in lines if line and not line.startswith("#"))
    }
    needed = _closure("leaseguard[redis,powertools]", "aws-lambda-powertools[tracer]")
    needed = {n: spec for n, spec in needed.items() if n != "leaseguard"}
    assert set(listed) == set(needed) - RUNTIME_SDK - COMPILED
    # leaseguard's bounds on what its extras name; the rest as their dependents resolve them.
    extras = _pyproject()["project"]["optional-dependencies"]
    bounds = {
        canonicalize_name(r.name): str(r.specifier)
        for r in (Requirement(d) for extra in ("redis", "powertools") for d in extras[extra])
    }
    assert {n: listed[n] for n in bounds if n in listed} == {
        n: spec for n, spec in bounds.items() if n in listed
    }
    assert all(not spec for n, spec in listed.items() if n not in bounds), listed
    makefile = (ROOT / layer / "Makefile").read_text(encoding="utf-8")
    assert "build-LeaseguardLayer:" in makefile
    assert "--no-deps" in makefile and "--platform any" in makefile
    # The runtime's SDK stand-in of make sam-build and sam-local: leaseguard's floor.
    floor = next(
        d for d in _pyproject()["project"]["optional-dependencies"]["dynamodb"] if "boto3" in d
    )
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    version = str(Requirement(floor).specifier).removeprefix(">=")
    assert f"RUNTIME_BOTO3 ?= {version}.0" in make


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _decorators(path: Path, function: str) -> list[str]:
    (fn,) = [
        n for n in ast.walk(_tree(path)) if isinstance(n, ast.FunctionDef) and n.name == function
    ]
    return [ast.unparse(d) for d in fn.decorator_list]


def test_tracing_is_on_where_a_tracer_records_and_in_the_documented_order(
    template: dict[str, Any],
) -> None:
    assert template["Globals"]["Function"]["Tracing"] == "Active"
    functions = ROOT / "functions"
    for path in (functions / "thread_worker" / "app.py", functions / "sweeper" / "app.py"):
        assert "tracer = Tracer()" in path.read_text(encoding="utf-8"), path
    # leaseguard.stacking.RECOMMENDED_STACK: logger, then tracer, then metrics, then the guard.
    worker = _decorators(functions / "thread_worker" / "app.py", "handler")
    assert worker[0] == "tracer.capture_lambda_handler", worker
    assert worker[1].startswith("lease_owned(") and "tracer=tracer" in worker[1], worker
    batch = _decorators(functions / "thread_worker" / "batch.py", "handler")
    assert batch == ["tracer.capture_lambda_handler", "handle_envelopes"]
    sweeper = _decorators(functions / "sweeper" / "app.py", "handler")
    assert sweeper == ["logger.inject_lambda_context", "tracer.capture_lambda_handler"]
