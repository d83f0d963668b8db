"""The backlog-per-task metric, read from and published to moto's SQS, ECS and CloudWatch."""

from __future__ import annotations

import datetime
import uuid

import boto3
import pytest

from agentkernel.aws import BacklogPublisher, backlog_per_task
from agentkernel.aws.scaling import lambda_handler
from agentkernel.core.errors import AKConfigError
from tests.transports.test_sqs import create_fifo

pytestmark = pytest.mark.aws


@pytest.mark.parametrize(
    ("depth", "running", "expected"), [(10, 5, 2.0), (7, 0, 7.0), (0, 3, 0.0), (3, 2, 1.5)]
)
def test_backlog_per_task(depth: int, running: int, expected: float) -> None:
    assert backlog_per_task(depth, running) == expected


def test_lambda_publishes_the_metric(aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = uuid.uuid4().hex[:8]
    queue = create_fifo(f"scale-{tag}")
    sqs = boto3.client("sqs")
    for i in range(6):
        sqs.send_message(
            QueueUrl=queue, MessageBody="x", MessageGroupId=f"s{i}", MessageDeduplicationId=f"d{i}"
        )
    ecs = boto3.client("ecs")
    ecs.create_cluster(clusterName=f"c-{tag}")
    ecs.register_task_definition(
        family=f"runner-{tag}", containerDefinitions=[{"name": "r", "image": "i", "memory": 128}]
    )
    ecs.create_service(
        cluster=f"c-{tag}",
        serviceName="agent-runner",
        taskDefinition=f"runner-{tag}",
        desiredCount=2,
    )
    monkeypatch.setenv("AK_EXECUTION__QUEUES__INPUT__URL", queue)
    monkeypatch.setenv("ECS_CLUSTER", f"c-{tag}")
    monkeypatch.setenv("ECS_SERVICE", "agent-runner")

    # moto runs no tasks, so runningCount is 0 and the backlog is divided by 1
    assert lambda_handler({}, None) == {"BacklogPerTask": 6.0}

    now = datetime.datetime.now(datetime.UTC)
    stats = boto3.client("cloudwatch").get_metric_statistics(
        Namespace="Custom/ECS",
        MetricName="BacklogPerTask",
        Dimensions=[
            {"Name": "ClusterName", "Value": f"c-{tag}"},
            {"Name": "ServiceName", "Value": "agent-runner"},
        ],
        StartTime=now - datetime.timedelta(minutes=5),
        EndTime=now + datetime.timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum"],
    )
    assert [p["Maximum"] for p in stats["Datapoints"]] == [6.0]


def test_unknown_service_is_a_config_error(aws: str) -> None:
    tag = uuid.uuid4().hex[:8]
    boto3.client("ecs").create_cluster(clusterName=f"c-{tag}")
    with pytest.raises(AKConfigError, match="no service"):
        BacklogPublisher(create_fifo(f"q-{tag}"), f"c-{tag}", "missing").publish()


def test_scaling_without_the_aws_extra_names_it() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['boto3'] = None\n"
        "try:\n    from agentkernel.aws import BacklogPublisher\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'agentkernel[aws]'" in out.stdout


def test_lambda_needs_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ECS_CLUSTER", raising=False)
    with pytest.raises(AKConfigError, match="ECS_CLUSTER"):
        lambda_handler({}, None)


def test_scaling_names_are_exported() -> None:
    from agentkernel.aws import BacklogPublisher as Exported
    from agentkernel.aws import backlog_per_task as exported

    assert Exported is BacklogPublisher and exported is backlog_per_task
