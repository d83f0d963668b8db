"""What the OpenAPI document (``/openapi.json``, ``/docs``) says about the chat and sessions
routes: their request body and headers, and every status each route can answer with the schema
of its body, so a generated client is typed.

The models below describe documents the front builds as plain dicts (:mod:`.answers`,
:mod:`.replies` of ``agentkernel.pipeline``); tests/api/test_openapi.py checks real answers
against them.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from agentkernel.pipeline.wire.chat import ChatRequest


class ChatReply(BaseModel):
    """A turn's reply."""

    result: str = Field(description="The agent's answer (JSON text when it returned a dict).")
    session_id: str
    request_id: str = Field(description="The turn's id: poll with it, quote it in support.")
    agent: str | None = Field(None, description="The agent that ran the turn.")
    attempt: int | None = Field(
        None,
        ge=1,
        description="The delivery of the turn that produced this reply: 1, or more when the "
        "turn was delivered again (after a RetryableError or a lost runner).",
    )


class Accepted(BaseModel):
    """A turn on the queue, to poll at the ``Location`` header."""

    status: Literal["ACCEPTED"]
    request_id: str
    session_id: str


class FieldError(BaseModel):
    """One invalid field of a request."""

    field: str = Field(description="Dotted path of the field, e.g. 'session_id'.")
    message: str


class ErrorDocument(BaseModel):
    """Every error answer: a code, a message saying what was wrong, and the turn when known."""

    error: str = Field(description="The code, e.g. INVALID_REQUEST, TURN_FAILED, TIMEOUT.")
    message: str = Field(description="What was wrong, for a human; the cause when known.")
    request_id: str | None = Field(None, description="The turn, when it was (or may be) queued.")
    session_id: str | None = None
    details: list[FieldError] | None = Field(None, description="INVALID_REQUEST: every field.")
    field: str | None = Field(None, description="INVALID_TEXT: the field with a lone surrogate.")
    reason: str | None = Field(
        None,
        description="INVALID_WEBHOOK: the rule the webhook URL broke (scheme, credentials, "
        "too_long, malformed, host_not_allowed, address_not_allowed, unresolvable).",
    )


class AgentInfo(BaseModel):
    """One registered agent."""

    name: str
    description: str | None = None
    streaming: bool


class AgentList(BaseModel):
    """The agents of this process."""

    agents: list[AgentInfo]


class Health(BaseModel):
    """The process answers."""

    status: Literal["ok"]


class Readiness(BaseModel):
    """Each dependency's check (``queue``, ``response_store``, ...: ``ok`` or why not)."""

    model_config = ConfigDict(extra="allow")

    status: Literal["ready", "not_ready"]
    warnings: list[str] | None = Field(None, description="What an operator should know.")


class NotReady(ErrorDocument, Readiness):
    """A dependency does not answer: error NOT_READY, and each check as in :class:`Readiness`."""


def install(app: FastAPI) -> None:
    """Serve ``app``'s document without the untyped JSON body FastAPI adds to a route that
    answers another media type (the event stream), so no client expects JSON there."""
    build = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            for route in build()["paths"].values():
                for operation in route.values():
                    for response in operation.get("responses", {}).values():
                        _drop_untyped_json(response.get("content", {}))
        return app.openapi_schema  # type: ignore[return-value]  # set by build()

    app.openapi = document  # type: ignore[method-assign]


def _drop_untyped_json(content: dict[str, Any]) -> None:
    if len(content) > 1 and content.get("application/json", {}).get("schema") == {}:
        del content["application/json"]


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"model": model, "description": description}


def _error(description: str) -> dict[str, Any]:
    return _json(ErrorDocument, description)


_UNAUTHORIZED = _error("Authentication is on and the credential is missing or bad.")
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
        **_json(
            ChatReply,
            "The reply; with 'Accept: text/event-stream', a stream of STREAM_CHUNK frames "
            "ending with a done frame.",
        ),
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    202: _json(Accepted, "Queued (async): poll the Location header."),
    400: _error(
        "Body is not a JSON object, the Idempotency-Key is not 1-255 characters "
        "(INVALID_IDEMPOTENCY_KEY), or the webhook may not be called: INVALID_WEBHOOK (see "
        "'reason'), or WEBHOOKS_DISABLED when the server has no webhook secret."
    ),
    401: _UNAUTHORIZED,
    404: _error("Unknown agent, or a session of another identity."),
    413: _error("Body larger than api.max_body_bytes."),
    422: _error(
        "Missing or invalid fields (INVALID_REQUEST), or an Idempotency-Key "
        "already used for a different request (IDEMPOTENCY_KEY_REUSED)."
    ),
    408: _error("The body did not arrive within api.body_timeout."),
    409: _error(
        "The turn was stopped: CANCELLED (a cancel, or a later turn's interrupt or rollback; "
        "cancelled_by names that turn) or SUPERSEDED (replaced before it started, "
        "superseded_by names the new turn); or SESSION_BUSY: multitask_strategy 'reject' "
        "while another turn of the session is queued or running."
    ),
    500: _error(
        "The turn failed: AGENT_ERROR, STATE_NOT_STORED, TURN_FAILED, REPLY_TOO_LARGE; the "
        "message names the cause."
    ),
    501: _error(
        "A multitask strategy other than enqueue, and this process cannot reach the session "
        "store (TURN_CONTROL_UNAVAILABLE)."
    ),
    503: _error(
        "Queue or reply store unavailable, or shutting down; when the turn may "
        "have been queued, request_id and a Location to poll are included."
    ),
    504: _error(
        "No reply within api.sync_timeout (TIMEOUT; poll the Location), or the "
        "agent ran past its turn deadline (TURN_TIMEOUT)."
    ),
}
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "text/event-stream of STREAM_CHUNK frames after Last-Event-ID, then done.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    400: _error("The request_id query parameter is missing."),
    401: _UNAUTHORIZED,
}
GET_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _json(ChatReply, "The reply."),
    400: _error(
        "The request_id (or, on the query form, the session_id) query parameter is missing."
    ),
    401: _UNAUTHORIZED,
    404: _error(
        "No reply to read: error PENDING (with Retry-After) while the turn runs, "
        "NOT_FOUND for an unknown, expired or another session's request."
    ),
    409: _error("The stored reply of a stopped turn (CANCELLED, SUPERSEDED, SESSION_BUSY)."),
    500: _error("The stored reply of a turn that failed (as POST's 500)."),
    503: _error("The reply store is unreachable; retry later."),
    504: _error("The stored reply of a turn past its deadline (TURN_TIMEOUT)."),
}


class Cancelled(BaseModel):
    """A turn that ended stopped: its final reply."""

    status: str = Field(description="CANCELLED, or SUPERSEDED for a turn replaced before it ran.")
    request_id: str
    session_id: str
    reply: dict[str, Any] = Field(description="The turn's final reply (error CANCELLED ...).")


class CancelRequested(BaseModel):
    """A cancel asked for a turn that has not answered yet."""

    status: str = Field(description="CANCEL_REQUESTED.")
    message: str
    request_id: str
    session_id: str


CANCEL_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _json(Cancelled, "The turn is stopped; reply is the final reply its callers got."),
    202: _json(
        CancelRequested,
        "Asked, not confirmed within execution.turn_control.cancel_wait (the turn waits behind "
        "another, or no runner is up); poll the Location for its final reply.",
    ),
    400: _error("The request_id query parameter is missing."),
    401: _UNAUTHORIZED,
    404: _error("NOT_FOUND: no such turn of the caller in this session."),
    409: _error(
        "ALREADY_FINISHED: the turn had answered before the cancel took; status_code is its "
        "reply's."
    ),
    501: _error("This process cannot reach the session store (TURN_CONTROL_UNAVAILABLE)."),
    503: _error("A store is unreachable; retry (a cancel is idempotent)."),
}
#: Answers of the routes outside the chat API that need a credential when auth is on.
PROTECTED_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _UNAUTHORIZED,
}
AGENTS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _json(AgentList, "The agents registered in this process."),
    401: _UNAUTHORIZED,
}
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {200: _json(Health, "The process answers.")}
READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _json(Readiness, "The broker and the stores answer."),
    503: _json(
        NotReady,
        "The broker or the response store does not answer: error NOT_READY, "
        "with which one in the body.",
    ),
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
    400: _error(
        "A malformed session id, limit (1-100) or cursor (INVALID_REQUEST, INVALID_CURSOR)."
    ),
    401: _UNAUTHORIZED,
    501: _error(
        "This process cannot read sessions (in-memory sessions of another process, or a store "
        "without an index): NOT_SUPPORTED."
    ),
    503: _error("A store is unreachable or lost its data; retry later."),
}
LIST_SESSIONS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _json(SessionList, "A page of the caller's sessions."),
    **_SESSION_ERRORS,
}
SHOW_SESSION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _json(SessionView, "The session."),
    404: _error(
        "NOT_FOUND: no such session of the caller (whether another identity has one of that id "
        "is never told)."
    ),
    **_SESSION_ERRORS,
}
DELETE_SESSION_RESPONSES: dict[int | str, dict[str, Any]] = {
    204: {
        "description": "Erased: the session's state, turn tickets, replies and stream chunks. "
        "Also answered when there was nothing to erase (idempotent, and telling nothing)."
    },
    **_SESSION_ERRORS,
}
