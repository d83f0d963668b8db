"""The wire format of the pipeline's messages: the INPUT body and the reply documents.

Shared by the Agent Runner (which answers turns), the response handler and the IO handler
(which answer on its behalf when a turn cannot run), so every answer has the same shape.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentkernel.pipeline.wire.envelope import (
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
)
from agentkernel.pipeline.wire.scoping import session_key

FORWARDED_ATTRIBUTES = (
    ATTR_USER_ID,
    ATTR_TRACEPARENT,
    ATTR_STREAM,
    ATTR_CONNECTION_ID,
    ATTR_ENDPOINT,
    ATTR_CLIENT_REQUEST_ID,
)


class ChatTurnBody(BaseModel):
    """The INPUT message body: what the client asked for."""

    model_config = ConfigDict(extra="allow")

    session_id: str = Field(min_length=1)
    prompt: str
    agent: str | None = None
    stream: bool = False
    webhook: str | None = None  # for the reply, not the agent (kept out of ``turn.extra``)


def error_doc(code: str, message: str, session_id: str, request_id: str) -> dict[str, Any]:
    """The body of an error reply."""
    return {"error": code, "message": message, "session_id": session_id, "request_id": request_id}


def turn_failed_doc(attempts: int, cause: str, session_id: str, request_id: str) -> dict[str, Any]:
    """The body of the reply to a turn that failed on every allowed delivery.

    Args:
        attempts: how many deliveries ran it.
        cause: its last error (:func:`~agentkernel.pipeline.runner.last_errors.cause_of`), or why it
            is not known here.
    """
    text = f"the turn failed on {attempts} attempts and was abandoned; last error: {cause}"
    return error_doc("TURN_FAILED", text, session_id, request_id)


def reply_attributes(message: QueueMessage, request_id: str) -> dict[str, str]:
    """Attributes of a message answering ``message``: its request id and forwarded ones."""
    forwarded = {k: message.attributes[k] for k in FORWARDED_ATTRIBUTES if k in message.attributes}
    return {ATTR_REQUEST_ID: request_id} | forwarded


def session_of(message: QueueMessage) -> str:
    try:
        session = json.loads(message.body).get("session_id")
    except (ValueError, AttributeError):
        session = None
    return str(session or message.group_id or "")


def session_mismatch(message: QueueMessage, body: ChatTurnBody) -> str | None:
    """Why a turn cannot run in the session its body names, or ``None`` when it can.

    The session is the message's group: its ordering key, which the broker serialises on (the
    session's key scoped by its owner, :func:`~agentkernel.pipeline.wire.scoping.session_key`). A
    body naming another session (or a message without a group) would run outside that order,
    in a session whose turns the broker does not hold back meanwhile.
    """
    if message.group_id is None:
        return "the message has no group (its session's ordering key)"
    if message.group_id != session_key(body.session_id, message.attributes.get(ATTR_USER_ID)):
        return "the body's session_id is not the message's group (its session's ordering key)"
    return None


def first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


def reply_message(
    turn: QueueMessage, session_id: str, request_id: str, status_code: int, body: str
) -> QueueMessage:
    """The OUTPUT message answering ``turn``: grouped by its session, deduplicated per turn.

    It carries the turn's webhook, if any, so whoever stores it can POST it there.
    """
    attributes = reply_attributes(turn, request_id)
    attributes[ATTR_STATUS_CODE] = str(status_code)
    if (webhook := webhook_of(turn)) is not None:
        attributes[ATTR_WEBHOOK] = webhook
    return QueueMessage(
        body=body,
        attributes=attributes,
        group_id=session_id or turn.group_id,
        dedup_id=f"{request_id}:reply",
    )


def webhook_of(turn: QueueMessage) -> str | None:
    """The webhook the INPUT body of ``turn`` names, or ``None``.

    The URL travels in the body rather than as an INPUT attribute: SQS allows 10 attributes a
    message and a WebSocket turn on Lambda already carries 7, so only the final reply (not the
    turn, not its chunks) spends one on it. A body without the key is not parsed.
    """
    if '"webhook"' not in turn.body:
        return None
    try:
        webhook = json.loads(turn.body).get("webhook")
    except (ValueError, AttributeError):
        return None
    return webhook if isinstance(webhook, str) and webhook else None
