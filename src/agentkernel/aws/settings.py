"""Configuration shared by the AWS entry points (ECS containers and Lambda functions).

Kept free of web-framework imports so a Lambda cold start does not pay for them.
"""

from __future__ import annotations

from agentkernel.core.config.root import AKConfig


def ecs_config(config: AKConfig | None = None) -> AKConfig:
    """The configuration with the ECS defaults: SQS queues, DynamoDB replies when a table is set."""
    config = config if config is not None else AKConfig.get()
    execution = config.execution
    queues, store = execution.queues, execution.response_store
    if queues.type == "in_memory":
        queues = queues.model_copy(update={"type": "sqs"})
    if store.type == "in_memory" and store.dynamodb is not None and store.dynamodb.table_name:
        store = store.model_copy(update={"type": "dynamodb"})
    execution = execution.model_copy(update={"queues": queues, "response_store": store})
    return config.model_copy(update={"execution": execution})


#: Where a container's API listens unless ``api.host`` is set: every interface, since a
#: container is reached through its network interface (``agentkernel serve`` keeps loopback).
CONTAINER_HOST = "0.0.0.0"


def container_api(config: AKConfig) -> AKConfig:
    """The configuration with ``api.host`` at :data:`CONTAINER_HOST` unless it was set."""
    if "host" in config.api.model_fields_set:
        return config
    api = config.api.model_copy(update={"host": CONTAINER_HOST})
    return config.model_copy(update={"api": api})
