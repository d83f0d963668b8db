"""What the OpenAPI document (``/openapi.json``, ``/docs``) says about the chat routes: their
request body and headers, and every status each can answer."""

from __future__ import annotations

from typing import Any

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
