"""Backlog per task: the metric an ECS target-tracking policy scales the Agent Runners on.

CPU says little about runners whose turns wait on a model, so the recommended signal is
``BacklogPerTask = ApproximateNumberOfMessages(INPUT) / max(runningTasks, 1)``, published every
minute (an EventBridge schedule invoking :func:`lambda_handler`) as the CloudWatch metric
``Custom/ECS/BacklogPerTask`` with the cluster and service as dimensions. A target-tracking policy
then keeps it at or below your ``backlog_target``.

Environment of the Lambda: ``AK_EXECUTION__QUEUES__INPUT__URL`` (the INPUT queue),
``ECS_CLUSTER`` and ``ECS_SERVICE`` (the Agent Runner service).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra

with require_extra("aws", "agentkernel.aws.scaling"):
    import boto3

logger = logging.getLogger(__name__)

NAMESPACE = "Custom/ECS"
METRIC_NAME = "BacklogPerTask"


def backlog_per_task(queue_depth: int, running_tasks: int) -> float:
    """Messages waiting per running task (a service scaled to zero counts as one task)."""
    return queue_depth / max(running_tasks, 1)


@dataclass
class BacklogPublisher:
    """Reads the INPUT queue depth and the service's running tasks, publishes the ratio.

    Args:
        queue_url: the INPUT queue.
        cluster: the ECS cluster of the Agent Runner service.
        service: the Agent Runner service.
    """

    queue_url: str
    cluster: str
    service: str

    def publish(self) -> float:
        """Compute and publish the metric; returns the value published."""
        attrs = boto3.client("sqs").get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        depth = int(attrs["ApproximateNumberOfMessages"])
        services = boto3.client("ecs").describe_services(
            cluster=self.cluster, services=[self.service]
        )["services"]
        if not services:
            raise AKConfigError(f"ECS_SERVICE: no service {self.service!r} in {self.cluster!r}")
        running = int(services[0]["runningCount"])
        value = backlog_per_task(depth, running)
        boto3.client("cloudwatch").put_metric_data(
            Namespace=NAMESPACE,
            MetricData=[
                {
                    "MetricName": METRIC_NAME,
                    "Value": value,
                    "Unit": "Count",
                    "Dimensions": [
                        {"Name": "ClusterName", "Value": self.cluster},
                        {"Name": "ServiceName", "Value": self.service},
                    ],
                }
            ],
        )
        logger.info("BacklogPerTask=%s (depth %s, running %s)", value, depth, running)
        return value


def lambda_handler(event: Any, context: Any) -> dict[str, float]:
    """Scheduled Lambda entry: publish the metric once."""
    queue_url = AKConfig.get().execution.queues.input.url
    cluster, service = os.environ.get("ECS_CLUSTER"), os.environ.get("ECS_SERVICE")
    if not (queue_url and cluster and service):
        raise AKConfigError(
            "AK_EXECUTION__QUEUES__INPUT__URL, ECS_CLUSTER and ECS_SERVICE must all be set"
        )
    return {METRIC_NAME: BacklogPublisher(queue_url, cluster, service).publish()}
