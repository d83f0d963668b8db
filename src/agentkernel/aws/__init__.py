"""AWS entry points with the queue-mode guide's names (ECS containers and Lambda functions).

Imported lazily, so ``import agentkernel.aws`` costs nothing until a class is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from agentkernel.aws.ecs import (
        ECSAgentRunner,
        ECSIOHandler,
        ECSOutputConsumer,
        ECSQueueRequestHandler,
        ECSSQSConsumer,
    )
    from agentkernel.aws.lambda_consumer import LambdaSQSConsumer
    from agentkernel.aws.request import Lambda
    from agentkernel.aws.responder import ResponseHandler
    from agentkernel.aws.runner import ServerlessAgentRunner, ServerlessStreamAgentRunner
    from agentkernel.aws.scaling import BacklogPublisher, backlog_per_task
    from agentkernel.aws.websocket import WebsocketConnectionHandler
    from agentkernel.pipeline.consumer.base import QueueConsumer

__all__ = [
    "BacklogPublisher",
    "ECSAgentRunner",
    "ECSIOHandler",
    "ECSOutputConsumer",
    "ECSQueueRequestHandler",
    "ECSSQSConsumer",
    "Lambda",
    "LambdaSQSConsumer",
    "QueueConsumer",
    "ResponseHandler",
    "ServerlessAgentRunner",
    "ServerlessStreamAgentRunner",
    "WebsocketConnectionHandler",
    "backlog_per_task",
]

_LAZY = {
    "ECSAgentRunner": "agentkernel.aws.ecs",
    "ECSIOHandler": "agentkernel.aws.ecs",
    "ECSOutputConsumer": "agentkernel.aws.ecs",
    "ECSQueueRequestHandler": "agentkernel.aws.ecs",
    "ECSSQSConsumer": "agentkernel.aws.ecs",
    "QueueConsumer": "agentkernel.pipeline.consumer.base",
    "Lambda": "agentkernel.aws.request",
    "LambdaSQSConsumer": "agentkernel.aws.lambda_consumer",
    "ResponseHandler": "agentkernel.aws.responder",
    "ServerlessAgentRunner": "agentkernel.aws.runner",
    "ServerlessStreamAgentRunner": "agentkernel.aws.runner",
    "WebsocketConnectionHandler": "agentkernel.aws.websocket",
    "BacklogPublisher": "agentkernel.aws.scaling",
    "backlog_per_task": "agentkernel.aws.scaling",
}


__getattr__ = lazy_getattr("agentkernel.aws", _LAZY)
