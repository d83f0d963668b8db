"""Upstream's ``agentkernel.pipeline.envelope``: the queue message under its old path."""

from agentkernel.pipeline.wire.envelope import (
    ATTR_CHUNK_INDEX,
    ATTR_CLIENT_REQUEST_ID,
    ATTR_CONNECTION_ID,
    ATTR_ENDPOINT,
    ATTR_REQUEST_ID,
    ATTR_STATUS_CODE,
    ATTR_STREAM,
    ATTR_TRACEPARENT,
    ATTR_USER_ID,
    ATTR_WEBHOOK,
    QueueMessage,
    QueueName,
)

__all__ = [
    "ATTR_CHUNK_INDEX",
    "ATTR_CLIENT_REQUEST_ID",
    "ATTR_CONNECTION_ID",
    "ATTR_ENDPOINT",
    "ATTR_REQUEST_ID",
    "ATTR_STATUS_CODE",
    "ATTR_STREAM",
    "ATTR_TRACEPARENT",
    "ATTR_USER_ID",
    "ATTR_WEBHOOK",
    "QueueMessage",
    "QueueName",
]
