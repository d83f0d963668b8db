"""The Terraform stacks are wired as the code and the queue-mode guide require."""

from __future__ import annotations

import re
from pathlib import Path

import botocore.session
import pytest
from botocore import xform_name

from agentkernel.pipeline.response_store import dynamodb as response_store_module
from tests.deploy import artifacts as a

SRC = a.ROOT / "src" / "agentkernel"

GUIDE_MODULES = {
    "queues",
    "request-handler",
    "agent-runner",
    "response-handler",
    "api-gateway",
    "websocket-api-gateway",
    "ws-connection-handler",
}

# The guide's task-role actions, and what the code also calls (tests below prove each is used):
# GetQueueAttributes (consumer start-up reads the lease and redrive, /ready and /metrics read
# depth) and DescribeTable (the response store's ping behind GET /ready).
IO_ROLE = {
    "SendToInput": {"sqs:SendMessage"} | {"sqs:GetQueueAttributes"},
    "ConsumeOutput": {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"}
    | {"sqs:GetQueueAttributes"},
    "ResponseStore": {
        "dynamodb:PutItem",
        "dynamodb:GetItem",
        "dynamodb:Query",
        "dynamodb:DeleteItem",
    }
    | {"dynamodb:DescribeTable"}
    | {"dynamodb:UpdateItem"},  # the per-identity quota counts
    "DeadLetterOutput": {"sqs:SendMessage"},  # an undecodable reply, copied to the DLQ at once
    # the sessions API: show, list (the owner index), erase; turn signals: open, stop, erase
    "SessionStore": {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:DeleteItem"}
    | {"dynamodb:UpdateItem", "dynamodb:BatchWriteItem"},
}
RUNNER_ROLE = {
    "ConsumeInput": {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"}
    | {"sqs:GetQueueAttributes"},
    "SendToOutput": {"sqs:SendMessage"},
    # sessions; turn signals: start, close, poll the stops
    "SessionStore": {"dynamodb:GetItem", "dynamodb:PutItem"}
    | {"dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchGetItem"},
    "DeadLetterInput": {"sqs:SendMessage"},  # an undecodable turn, copied to the DLQ at once
}


def policy(name: str, directory: Path = a.ECS) -> dict[str, tuple[set[str], list[str]]]:
    document = a.blocks(directory, "data", "aws_iam_policy_document")[name]
    return {s["sid"]: (set(s["actions"]), s["resources"]) for s in document["statement"]}


def api_calls(source: Path, service: str) -> set[str]:
    """IAM actions for the ``service`` API operations a module's source names."""
    text = source.read_text()
    model = botocore.session.get_session().get_service_model(service)
    prefix = {"sqs": "sqs", "dynamodb": "dynamodb"}[service]
    return {
        f"{prefix}:{op}"
        for op in model.operation_names
        if re.search(rf"""[."']{xform_name(op)}\b""", text)
    }


def test_the_guides_modules_exist() -> None:
    present = {p.name for p in a.MODULES.iterdir() if (p / "main.tf").is_file()}
    assert present >= GUIDE_MODULES | {"tables"}


def test_queues_are_fifo_without_content_based_dedup() -> None:
    for queue in a.resources(a.MODULES / "queues", "aws_sqs_queue").values():
        assert queue["fifo_queue"] is True
        assert queue["content_based_deduplication"] is False
        assert str(queue["name"]).endswith(".fifo")


def test_redrive_count_is_the_app_count_plus_one() -> None:
    queues = a.MODULES / "queues"
    queue = a.resources(queues, "aws_sqs_queue")["queue"]
    redrive = a.expression(queue["redrive_policy"])
    assert re.search(r"maxReceiveCount\s*=\s*each\.value\.max_receive_count\s*\+\s*1\b", redrive)
    local_queues = a.locals_of(queues)["queues"]
    for name in ("input", "output"):
        assert (
            a.expression(local_queues[name]["max_receive_count"]) == f"var.{name}_max_receive_count"
        )
    outputs = {k: v for block in a.terraform(queues)["output"] for k, v in block.items()}
    assert (
        a.expression(outputs["input_max_receive_count"]["value"]) == "var.input_max_receive_count"
    )


def test_the_app_count_the_containers_get_is_the_count_the_redrive_adds_one_to() -> None:
    ecs_queues = a.module_calls(a.ECS)["queues"]
    assert a.expression(ecs_queues["input_max_receive_count"]) == "var.max_receive_count"
    runner_env = a.expression(a.locals_of(a.ECS)["runner_environment"])
    assert re.search(
        r"AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT\s*=\s*tostring\("
        r"module\.queues\[0\]\.input_max_receive_count\)",
        runner_env,
    )
    serverless = a.module_calls(a.SERVERLESS)
    assert a.expression(serverless["queues"]["input_max_receive_count"]) == "var.max_receive_count"
    assert a.expression(serverless["agent_runner"]["max_receive_count"]) == (
        "module.queues.input_max_receive_count"
    )
    module_env = a.expression(a.locals_of(a.MODULES / "agent-runner")["environment"])
    assert "AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT = tostring(var.max_receive_count)" in (
        module_env
    )


@pytest.mark.parametrize("runner_timeout", [None, 15, 300])
def test_input_visibility_timeout_is_at_least_six_runner_timeouts(runner_timeout) -> None:
    overrides = {} if runner_timeout is None else {"agent_runner_timeout_seconds": runner_timeout}
    calls = a.module_calls(a.SERVERLESS)
    visibility = a.evaluate(
        calls["queues"]["input_visibility_timeout_seconds"], a.SERVERLESS, overrides
    )
    timeout = a.evaluate(calls["agent_runner"]["timeout_seconds"], a.SERVERLESS, overrides)
    assert visibility >= 6 * timeout
    out_visibility = a.evaluate(
        calls["queues"]["output_visibility_timeout_seconds"], a.SERVERLESS, overrides
    )
    assert out_visibility >= 6 * a.evaluate(
        calls["response_handler"]["timeout_seconds"], a.SERVERLESS, overrides
    )
    function = a.module_calls(a.MODULES / "agent-runner")["function"]
    assert a.expression(function["timeout_seconds"]) == "var.timeout_seconds"
    lambda_fn = a.resources(a.MODULES / "lambda-function", "aws_lambda_function")["this"]
    assert a.expression(lambda_fn["timeout"]) == "var.timeout_seconds"


def test_event_source_mappings_report_batch_item_failures() -> None:
    for module in ("agent-runner", "response-handler"):
        mappings = a.resources(a.MODULES / module, "aws_lambda_event_source_mapping")
        assert len(mappings) == 1
        for mapping in mappings.values():
            assert mapping["function_response_types"] == ["ReportBatchItemFailures"]


def test_tables_match_the_store_code() -> None:
    text = {
        "response": (SRC / "pipeline" / "response_store" / "dynamodb.py").read_text(),
        "session": (SRC / "pipeline" / "session_store" / "dynamodb.py").read_text(),
    }
    key_in_code = {
        name: re.search(r'Key=\{"(\w+)": \{"S"', source).group(1) for name, source in text.items()
    }
    key_in_code["connections"] = "connection_id"  # the WebSocket connection handler (issue 10)
    assert key_in_code == {
        "response": "request_id",
        "session": "session_id",
        "connections": "connection_id",
    }
    assert '"expiry_time"' in text["session"]
    tables = a.locals_of(a.MODULES / "tables")["tables"]
    declared = a.expression(tables)
    for name, key in key_in_code.items():
        assert re.search(rf'{name} = \{{name = "[^"]*", hash_key = "{key}"\}}', declared), name
    table = a.resources(a.MODULES / "tables", "aws_dynamodb_table")["table"]
    assert table["attribute"][0] == {"name": "${each.value.hash_key}", "type": "S"}
    assert table["ttl"][0]["attribute_name"] == response_store_module.TTL_ATTRIBUTE
    assert table["ttl"][0]["enabled"] is True


def test_ecs_task_roles_have_the_guides_actions_each_on_its_resource() -> None:
    io, runner = policy("io"), policy("runner")
    assert {sid: actions for sid, (actions, _) in io.items()} == IO_ROLE
    assert {sid: actions for sid, (actions, _) in runner.items()} == RUNNER_ROLE
    assert (
        io["SendToInput"][1] == runner["ConsumeInput"][1] == ["${module.queues[0].input_queue_arn}"]
    )
    assert (
        io["ConsumeOutput"][1]
        == runner["SendToOutput"][1]
        == ["${module.queues[0].output_queue_arn}"]
    )
    assert io["ResponseStore"][1] == ["${module.tables[0].response_table_arn}"]
    assert runner["SessionStore"][1] == ["${module.tables[0].session_table_arn}"]
    table = "${module.tables[0].session_table_arn}"
    assert io["SessionStore"][1] == [table, f"{table}/index/by_owner"]


def test_the_roles_cover_every_api_call_the_code_makes() -> None:
    sqs_calls = api_calls(SRC / "pipeline" / "transport" / "sqs.py", "sqs")
    assert sqs_calls == {
        "sqs:SendMessage",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
    }
    granted_sqs = set().union(*(p[0] for p in (*policy("io").values(), *policy("runner").values())))
    assert sqs_calls <= granted_sqs
    # an undecodable message is copied to the dead-letter queue of the queue its role consumes
    for role, sid, dlq in (
        ("io", "DeadLetterOutput", "output"),
        ("runner", "DeadLetterInput", "input"),
    ):
        actions, resources = policy(role)[sid]
        assert actions == {"sqs:SendMessage"}
        assert resources == [f"${{module.queues[0].{dlq}_dlq_arn}}"]
    store_calls = api_calls(SRC / "pipeline" / "response_store" / "dynamodb.py", "dynamodb")
    store_calls |= api_calls(SRC / "pipeline" / "quota" / "dynamodb.py", "dynamodb")
    assert store_calls <= policy("io")["ResponseStore"][0]
    session_calls = api_calls(SRC / "pipeline" / "session_store" / "dynamodb.py", "dynamodb")
    # the runner reads (also its start-up check and /ready) and commits; the IO process's
    # sessions API shows, lists and erases
    runner, io = policy("runner")["SessionStore"][0], policy("io")["SessionStore"][0]
    assert {"dynamodb:GetItem", "dynamodb:PutItem"} <= runner
    assert {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:DeleteItem"} <= io
    assert session_calls <= runner | io


def test_the_roles_may_keep_the_turn_signals_in_the_session_table() -> None:
    """Turn control keeps its signals in the session table: each front opens turns, asks them to
    stop and erases a session's; each runner starts, closes and polls them. Without these, every
    turn of a DynamoDB deployment would be refused AccessDenied."""
    calls = api_calls(SRC / "pipeline" / "turn_control" / "signals_dynamodb.py", "dynamodb")
    front = {"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"}
    front |= {"dynamodb:BatchWriteItem"}
    runner = {"dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchGetItem"}
    assert calls == front | runner
    assert front <= policy("io")["SessionStore"][0]
    assert runner <= policy("runner")["SessionStore"][0]
    assert front <= session_table_actions("request-handler")
    assert runner <= session_table_actions("agent-runner")


def session_table_actions(module: str) -> set[str]:
    """The actions a serverless module's function is granted on the session table."""
    text = a.expression(a.locals_of(a.MODULES / module)["sessions"])
    assert "var.session_table_arn]" in text or "var.session_table_arn," in text, module
    return set(re.findall(r'"(dynamodb:\w+)"', text))


def response_table_actions(module: str) -> set[str]:
    """The actions a serverless module's function is granted on the response table."""
    text = a.expression(a.module_calls(a.MODULES / module)["function"]["policy_statements"])
    statements = re.findall(r"\{sid = [^{}]*\}", text)
    granted = [st for st in statements if "var.response_table_arn" in st]
    assert len(granted) == 1, module
    return set(re.findall(r'"(dynamodb:\w+)"', granted[0]))


def test_the_lambda_functions_may_make_the_response_table_calls_their_code_makes() -> None:
    """Seen in issue 24: the request handler was granted GetItem only, but the front it runs
    writes each turn's ticket and the deployment secret (PutItem) and, with the quota ledger,
    counts each turn (UpdateItem); the response handler counts stored bytes (UpdateItem)."""
    code = api_calls(SRC / "pipeline" / "response_store" / "dynamodb.py", "dynamodb")
    code |= api_calls(SRC / "pipeline" / "quota" / "dynamodb.py", "dynamodb")
    # the front: read replies and tickets, write tickets and the secret, check and count quotas
    front = {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"}
    # the response handler: write replies and chunks, count their bytes
    writer = {"dynamodb:PutItem", "dynamodb:UpdateItem"}
    assert front | writer <= code
    assert front <= response_table_actions("request-handler")
    assert writer <= response_table_actions("response-handler")


def all_statements() -> list[tuple[str, dict]]:
    found = []
    for directory in [a.ECS, *[p for p in a.MODULES.iterdir() if p.is_dir()]]:
        for name, document in a.blocks(directory, "data", "aws_iam_policy_document").items():
            found += [(f"{directory.name}/{name}", s) for s in document["statement"]]
        for name, call in a.module_calls(directory).items():
            text = a.expression(call.get("policy_statements", ""))
            for actions in re.findall(r"actions\s*=\s*\[([^\]]*)\]", text):
                found.append(
                    (f"{directory.name}/{name}", {"actions": re.findall(r'"([^"]+)"', actions)})
                )
    return found


def test_no_wildcard_actions_and_no_wildcard_resource_without_a_condition() -> None:
    statements = all_statements()
    assert len(statements) >= 15
    for where, statement in statements:
        for action in statement["actions"]:
            assert "*" not in action, f"{where}: {action}"
        if statement.get("resources") == ["*"]:
            # PutMetricData has no resource-level permissions; its namespace must be pinned.
            assert statement["actions"] == ["cloudwatch:PutMetricData"], where
            assert statement["condition"][0]["variable"] == "cloudwatch:namespace", where


def test_scaling_publishes_the_metric_target_tracking_reads() -> None:
    from agentkernel.aws import scaling

    function = a.resources(a.ECS, "aws_lambda_function")["scaling"]
    module, _, attribute = function["handler"].rpartition(".")
    assert module == scaling.__name__ and callable(getattr(scaling, attribute))
    env = function["environment"][0]["variables"]
    assert set(env) == {"AK_EXECUTION__QUEUES__INPUT__URL", "ECS_CLUSTER", "ECS_SERVICE"}
    rule = a.resources(a.ECS, "aws_cloudwatch_event_rule")["scaling"]
    assert rule["schedule_expression"] == "rate(1 minute)"
    policy_ = a.resources(a.ECS, "aws_appautoscaling_policy")["backlog"]
    spec = policy_["target_tracking_scaling_policy_configuration"][0]
    metric = spec["customized_metric_specification"][0]
    assert (metric["namespace"], metric["metric_name"]) == (scaling.NAMESPACE, scaling.METRIC_NAME)
    assert {d["name"] for d in metric["dimensions"]} == {"ClusterName", "ServiceName"}
    assert a.expression(spec["target_value"]) == "var.scaling_config.backlog_target"
    source = (SRC / "aws" / "scaling.py").read_text()
    assert '"ClusterName"' in source and '"ServiceName"' in source


@pytest.mark.parametrize("max_turn", [None, 60, 99])
def test_ecs_stop_timeout_exceeds_the_runner_drain(max_turn) -> None:
    overrides = {} if max_turn is None else {"max_turn_seconds": max_turn}
    locals_ = a.locals_of(a.ECS)
    drain = a.evaluate(locals_["runner_drain_seconds"], a.ECS, overrides)
    from agentkernel.core.config.queues import SQSQueueConfig

    longest_poll = SQSQueueConfig().wait_time_seconds
    turn = overrides.get("max_turn_seconds", a.defaults(a.ECS)["max_turn_seconds"])
    assert drain >= turn + longest_poll
    stop = a.defaults(a.ECS)["stop_timeout_seconds"]
    assert drain < stop <= 120  # Fargate's ceiling
    defaults_ = a.locals_of(a.ECS)["container_defaults"]
    assert a.expression(defaults_["stopTimeout"]) == "var.stop_timeout_seconds"
    task = a.resources(a.ECS, "aws_ecs_task_definition")["runner"]
    precondition = task["lifecycle"][0]["precondition"][0]
    assert a.expression(precondition["condition"]) == (
        "var.stop_timeout_seconds > local.runner_drain_seconds"
    )


def test_request_handler_http_routes_exist_in_the_api() -> None:
    routes = a.locals_of(a.MODULES / "api-gateway")["routes"]
    declared = set(re.findall(r'"(GET|POST|DELETE) ([^"]+)"', a.expression(routes)))
    from agentkernel.pipeline.http.request_handler import RequestHandler
    from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
    from agentkernel.pipeline.transport.in_memory import InMemoryTransport

    app = RequestHandler(InMemoryTransport(), InMemoryResponseStore()).build_app()
    served = {(m, r.path) for r in app.routes for m in getattr(r, "methods", ())}
    assert declared and declared <= served
    assert ("DELETE", "/api/v1/sessions/{session_id}") in declared  # the sessions API too


def test_the_session_table_has_the_owner_index_the_sessions_api_lists_by() -> None:
    from agentkernel.pipeline.session_store.dynamodb import OWNER_INDEX

    text = (a.MODULES / "tables" / "main.tf").read_text()
    index = re.search(r'dynamic "global_secondary_index" \{(.*?)\n  \}', text, re.S)
    assert index is not None
    block = index.group(1)
    assert f'["{OWNER_INDEX}"]' in block and 'each.key == "session"' in block
    assert re.search(r'hash_key\s*=\s*"owner_scope"', block)
    assert re.search(r'range_key\s*=\s*"active_at"', block)
    assert '{ owner_scope = "S", active_at = "N" }' in text


def test_the_ecs_runner_serves_its_health_port_and_the_task_checks_it() -> None:
    env = re.sub(r"\s+", " ", a.expression(a.locals_of(a.ECS)["runner_environment"]))
    assert "AK_EXECUTION__RUNNER__HEALTH_PORT = tostring(var.runner_health_port)" in env
    assert 'AK_EXECUTION__RUNNER__HEALTH_HOST = "0.0.0.0"' in env
    assert a.variables(a.ECS)["runner_health_port"]["default"] == 8001
    task = a.resources(a.ECS, "aws_ecs_task_definition")["runner"]
    container = re.sub(r"\s+", " ", a.expression(task["container_definitions"]))
    assert 'healthCheck = {command = ["CMD", "python", "/app/healthcheck.py"]' in container
