"""What the OpenAPI document (``/openapi.json``, ``/docs``) says about the chat and sessions
routes: their request body and headers, the documents they answer, and every status each can
answer."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agentkernel.pipeline.chat import ChatRequest

_ERROR: dict[str, Any] = {
    "content": {"application/json": {"example": {"error": "CODE", "message": "why"}}}
}
POST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ChatRequest.model_json_schema()}},
    },
    "parameters": [
        {
            "name": "Prefer",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "'respond-async' answers 202 at once instead of waiting.",
        },
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "Re-POSTing with the same key returns the same turn's reply.",
        },
    ],
}
POST_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The reply: result, session_id, request_id, agent; with 'Accept: "
        "text/event-stream', a stream of STREAM_CHUNK frames ending with a done frame."
    },
    202: {"description": "Queued (async): status ACCEPTED, request_id, session_id."},
    400: {
        "description": "Body is not a JSON object, or the Idempotency-Key is not 1-255 "
        "characters (INVALID_IDEMPOTENCY_KEY).",
        **_ERROR,
    },
    401: {"description": "Authentication is on and the credential is missing or bad.", **_ERROR},
    404: {"description": "Unknown agent, or a session of another identity.", **_ERROR},
    413: {"description": "Body larger than api.max_body_bytes.", **_ERROR},
    422: {
        "description": "Missing or invalid fields (INVALID_REQUEST), or an Idempotency-Key "
        "already used for a different request (IDEMPOTENCY_KEY_REUSED).",
        **_ERROR,
    },
    408: {"description": "The body did not arrive within api.body_timeout.", **_ERROR},
    500: {"description": "The agent failed; the body explains.", **_ERROR},
    503: {
        "description": "Queue or reply store unavailable, or shutting down; when the turn may "
        "have been queued, request_id and a Location to poll are included.",
        **_ERROR,
    },
    504: {
        "description": "No reply within api.sync_timeout (TIMEOUT; poll the Location), or the "
        "agent ran past its turn deadline (TURN_TIMEOUT).",
        **_ERROR,
    },
}
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "text/event-stream of STREAM_CHUNK frames after Last-Event-ID, then done.",
        "content": {"text/event-stream": {}},
    },
    400: {"description": "The request_id query parameter is missing.", **_ERROR},
    401: {"description": "Authentication is on and the credential is missing or bad.", **_ERROR},
}
GET_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The reply."},
    400: {
        "description": "The request_id (or, on the query form, the session_id) query parameter "
        "is missing.",
        **_ERROR,
    },
    401: {"description": "Authentication is on and the credential is missing or bad.", **_ERROR},
    404: {
        "description": "No reply to read: error PENDING (with Retry-After) while the turn runs, "
        "NOT_FOUND for an unknown, expired or another session's request.",
        **_ERROR,
    },
    500: {"description": "The stored reply of a turn whose agent failed.", **_ERROR},
    503: {"description": "The reply store is unreachable; retry later.", **_ERROR},
    504: {"description": "The stored reply of a turn past its deadline (TURN_TIMEOUT).", **_ERROR},
}
#: Answers of the routes outside the chat API that need a credential when auth is on.
PROTECTED_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "Authentication is on and the credential is missing or bad.", **_ERROR},
}
READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "The broker or the response store does not answer: error NOT_READY, "
        "with which one in the body.",
        **_ERROR,
    },
}


class ListedSession(BaseModel):
    """A session in a listing."""

    session_id: str = Field(description="The id the client gave the session.")
    last_activity_at: str = Field(description="ISO 8601 UTC time of its last committed turn.")


class SessionList(BaseModel):
    """``GET /api/v1/sessions``: one page of the caller's sessions, newest activity first."""

    sessions: list[ListedSession]
    next_cursor: str | None = Field(
        description="Pass as 'cursor' for the next page; null on the last page."
    )


class SessionTurn(BaseModel):
    """A committed turn of a session (the latest 50 are kept)."""

    request_id: str
    status_code: int = Field(description="Status of the turn's reply (200, 500, 504, ...).")
    error: str | None = Field(description="The reply's error code; null for a success.")
    finished_at: str = Field(description="ISO 8601 UTC time the turn was committed.")


class LastReply(BaseModel):
    """The reply of the session's latest committed turn."""

    request_id: str
    status_code: int
    body: dict[str, Any] = Field(description="The reply document, as a poll returns it.")


class SessionView(BaseModel):
    """``GET /api/v1/sessions/{session_id}``: one of the caller's sessions."""

    session_id: str
    version: int = Field(description="Raised by one with every write of the session.")
    state: dict[str, Any] = Field(description="The agent's state of the session.")
    last_activity_at: str | None
    turns: list[SessionTurn] = Field(description="Recent turns, newest first.")
    last_reply: LastReply | None


_SESSION_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "description": "A malformed session id, limit (1-100) or cursor (INVALID_REQUEST, "
        "INVALID_CURSOR).",
        **_ERROR,
    },
    401: {"description": "Authentication is on and the credential is missing or bad.", **_ERROR},
    501: {
        "description": "This process cannot read sessions (in-memory sessions of another "
        "process, or a store without an index): NOT_SUPPORTED.",
        **_ERROR,
    },
    503: {"description": "A store is unreachable or lost its data; retry later.", **_ERROR},
}
LIST_SESSIONS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SessionList, "description": "A page of the caller's sessions."},
    **_SESSION_ERRORS,
}
SHOW_SESSION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SessionView, "description": "The session."},
    404: {
        "description": "NOT_FOUND: no such session of the caller (whether another identity "
        "has one of that id is never told).",
        **_ERROR,
    },
    **_SESSION_ERRORS,
}
DELETE_SESSION_RESPONSES: dict[int | str, dict[str, Any]] = {
    204: {
        "description": "Erased: the session's state, turn tickets, replies and stream chunks. "
        "Also answered when there was nothing to erase (idempotent, and telling nothing)."
    },
    **_SESSION_ERRORS,
}
