"""A chat turn as clients send it, checked the same way by every front (HTTP, WebSocket, Lambda).

Nothing here imports a web framework, so the Lambda request handler can use it without loading
FastAPI on a cold start.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

_IDEMPOTENCY_NS = uuid.UUID("6f1c3a4e-8f7d-4c1b-9a55-2f3e0b7c9d10")


class ChatRequest(BaseModel):
    """Body of ``POST /api/v1/chat``; extra fields are passed to the agent as ``turn.extra``."""

    model_config = ConfigDict(extra="allow")

    session_id: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Conversation id; turns of one session run one at a time, in order.",
    )
    prompt: str = Field(min_length=1, description="The user's message.")
    agent: str | None = Field(
        None, max_length=64, description="Agent to run; default: the first registered one."
    )
    stream: bool = Field(
        False,
        description="Send the reply as chunks while the agent produces them (set by SSE and "
        "WebSocket clients).",
    )


class HTTPError(Exception):
    """An error answer: status plus a JSON document with ``error`` and ``message``."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.doc = {"error": code, "message": message, **extra}


def parse_chat(raw: bytes) -> ChatRequest:
    """Decode and validate a chat body.

    Raises:
        HTTPError: 400 for a body that is not a JSON object, 422 for invalid fields.
    """
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPError(400, "INVALID_JSON", f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise HTTPError(400, "INVALID_JSON", "the body is nested too deeply") from exc
    if not isinstance(data, dict):
        raise HTTPError(400, "INVALID_JSON", "the body must be a JSON object")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        details = [
            {"field": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in exc.errors()
        ]
        raise HTTPError(
            422, "INVALID_REQUEST", "the chat request is invalid", details=details
        ) from exc


def request_id_for(session_id: str, idempotency_key: str | None) -> tuple[str, bool]:
    """The turn's request id: a fresh one (``True``), or one derived from an idempotency key.

    Raises:
        HTTPError: 400 for a key that is empty or longer than 255 characters.
    """
    if idempotency_key is None:
        return uuid.uuid4().hex, True
    if not 1 <= len(idempotency_key) <= 255:
        raise HTTPError(400, "INVALID_IDEMPOTENCY_KEY", "Idempotency-Key must be 1-255 chars")
    return uuid.uuid5(_IDEMPOTENCY_NS, f"{session_id}\n{idempotency_key}").hex, False
