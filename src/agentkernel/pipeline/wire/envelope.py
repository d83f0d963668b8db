"""The message envelope every pipeline component exchanges, and the attribute keys it carries."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentkernel.pipeline.wire.position import Position

ATTR_REQUEST_ID = "request_id"
ATTR_USER_ID = "user_id"
ATTR_STATUS_CODE = "status_code"
ATTR_TRACEPARENT = "traceparent"
#: Set on OUTPUT messages that carry one chunk of a streamed reply: the chunk's 0-based index.
ATTR_CHUNK_INDEX = "chunk_index"
#: Set on a turn whose reply is streamed as chunks (forwarded to its reply).
ATTR_STREAM = "stream"
#: The WebSocket connection a turn came from, and the API Gateway management endpoint that
#: reaches it (serverless WebSocket turns; forwarded to the reply).
ATTR_CONNECTION_ID = "ws_connection_id"
ATTR_ENDPOINT = "ws_endpoint"
#: The WebSocket client's own id for a turn, echoed in the frames that answer it (forwarded
#: to the reply; the turn's request id is derived from it per identity).
ATTR_CLIENT_REQUEST_ID = "ws_client_request_id"
#: The webhook a turn's final reply is POSTed to: copied by the runner from the INPUT body onto
#: the final reply only (never onto chunks), where the response handler reads it.
ATTR_WEBHOOK = "webhook"


class QueueName(StrEnum):
    """The two queues of the pipeline. They never see each other's messages."""

    INPUT = "input"
    OUTPUT = "output"


class QueueMessage(BaseModel):
    """One message on a queue.

    Attributes:
        body: the JSON payload, as text.
        attributes: routing metadata (request id, user id, status code, trace context), kept
            byte-identical across the broker.
        group_id: the ordering key (the session id). Messages of one group are delivered in
            order and one at a time.
        dedup_id: a second send with the same id inside the transport's window is dropped.
        receive_count: 1-based number of this delivery; exact on every transport.
        message_id: the broker's identity of the message, for logs.
        position: where the broker delivered it from (its ordering unit and monotonic
            sequence there), set by the transport on received messages; ``None`` when the
            broker has no such order (SQS standard queues). Never serialised.
        undecodable: why the transport could not decode what the broker delivered (a body or
            header that is not UTF-8, an envelope that is not ours), or ``None``. Such a message
            carries only what could be read (often a ``request_id``) and is never processed:
            the message handling answers it if it can and dead-letters it.
        native: the transport's handle for ack/nack; never serialised.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    body: str = ""
    attributes: dict[str, str] = Field(default_factory=dict)
    group_id: str | None = None
    dedup_id: str | None = None
    receive_count: int = 1
    message_id: str | None = None
    position: Position | None = Field(default=None, exclude=True)
    undecodable: str | None = None
    native: Any = Field(default=None, exclude=True, repr=False)
