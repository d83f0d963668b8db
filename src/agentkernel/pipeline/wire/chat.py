"""A chat turn as clients send it, checked the same way by every front (HTTP, WebSocket, Lambda).

Nothing here imports a web framework, so the Lambda request handler can use it without loading
FastAPI on a cold start.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config.turns import MultitaskStrategy
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, ATTR_USER_ID, QueueMessage
from agentkernel.pipeline.wire.json_text import lone_surrogate_field
from agentkernel.pipeline.wire.scoping import session_key

#: The chat routes' path: ``POST`` a turn, ``GET {CHAT_PATH}/{session_id}?request_id=`` its reply.
CHAT_PATH = "/api/v1/chat"
_TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
#: Deepest nesting of arrays and objects a chat body may have: deeper bodies are refused before
#: they are queued, since serializers along the way (and the runner's parser) stop near 200.
MAX_JSON_DEPTH = 64
# A session id as ChatRequest checks it: 1-256 characters, no control character, no '/'.
_SESSION_ID = re.compile(r"[^\x00-\x1f\x7f/]{1,256}")


def _path_segment(session_id: str) -> str:
    """A session id is one segment of ``GET /api/v1/chat/{session_id}``: it must stay one."""
    if "/" in session_id or session_id in (".", ".."):
        raise ValueError("must not contain '/' or be '.' or '..' (it is a URL path segment)")
    return session_id


class ChatRequest(BaseModel):
    """Body of ``POST /api/v1/chat``; extra fields are passed to the agent as ``turn.extra``."""

    model_config = ConfigDict(extra="allow")

    session_id: Annotated[str, AfterValidator(_path_segment)] = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Conversation id; turns of one session run one at a time, in order. "
        "No control characters and no '/', since it is a segment of the polling URL.",
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
    multitask_strategy: MultitaskStrategy | None = Field(
        None,
        description="What this turn does to the session's turns still queued or running: "
        "enqueue (wait behind them), reject (409 while one is), interrupt (cancel them, keep "
        "their state so far), rollback (cancel them, keep nothing), coalesce (replace those "
        "not started yet). Default: execution.turn_control.multitask_strategy.",
    )
    webhook: str | None = Field(
        None,
        description="An https URL the service POSTs the turn's final reply to, signed, when "
        "the turn ends (any outcome); hosts are limited by api.webhooks. See "
        "docs/turn-control.md, 'Completion webhooks'.",
        json_schema_extra={"format": "uri", "maxLength": 2048},
    )


class HTTPError(Exception):
    """An error answer: status plus a JSON document with ``error`` and ``message``.

    ``headers`` are sent with it (``Location``, ``Retry-After``, ``Connection``).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.doc = {"error": code, "message": message, **extra}
        self.headers = headers or {}


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
    if _too_deep(data):
        raise HTTPError(
            400, "INVALID_JSON", f"the body is nested more than {MAX_JSON_DEPTH} levels deep"
        )
    if (field := lone_surrogate_field(data)) is not None:
        message = f"field {field!r} holds a lone surrogate (not encodable text)"
        raise HTTPError(400, "INVALID_TEXT", message, field=field)
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        details = [
            {"field": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in exc.errors()
        ]
        raise HTTPError(
            422, "INVALID_REQUEST", "the chat request is invalid", details=details
        ) from exc


def _too_deep(data: Any) -> bool:
    level: list[Any] = [data]
    for _ in range(MAX_JSON_DEPTH):
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, (dict, list))
        ]
        if not level:
            return False
    return True


def request_id_for(
    session_id: str,
    idempotency_key: str | None,
    user: str | None,
    secret: bytes | str,
) -> tuple[str, bool]:
    """The turn's request id: a fresh one (``True``), or one derived from an idempotency key.

    A derived id is an HMAC of the user, session and key under ``secret`` (the configured
    ``api.idempotency_secret``, or the deployment's secret kept in the response store), so
    nobody without the secret can compute another client's id.

    Raises:
        HTTPError: 400 for a key that is empty or longer than 255 characters.
    """
    if idempotency_key is None:
        return secrets.token_hex(16), True  # as random as a uuid4, without building one
    check_idempotency_key(idempotency_key)
    text = (
        f"{session_id}\n{idempotency_key}"
        if user is None
        else f"{user}\n{session_id}\n{idempotency_key}"
    )
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32], False


def check_idempotency_key(idempotency_key: str) -> str:
    """Raises:
    HTTPError: 400 for a key that is empty or longer than 255 characters."""
    if not 1 <= len(idempotency_key) <= 255:
        raise HTTPError(400, "INVALID_IDEMPOTENCY_KEY", "Idempotency-Key must be 1-255 chars")
    return idempotency_key


def fingerprint(chat: ChatRequest) -> str:
    """A digest of what the turn asks for (every field but ``stream`` and
    ``multitask_strategy``, which say how it travels, not what it asks), so a retry under the
    same ``Idempotency-Key`` can be told from a new turn."""
    unset = {"webhook"} if chat.webhook is None else set()  # fingerprints from before it
    content = chat.model_dump(mode="json", exclude={"stream", "multitask_strategy"} | unset)
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def check_agent(chat: ChatRequest, registry: AgentRegistry) -> ChatRequest:
    """Refuse a turn for an agent this process knows does not exist (a process without agents,
    such as an IO process, leaves that check to the runner).

    Raises:
        HTTPError: 404 ``AGENT_NOT_FOUND``.
    """
    if registry.agents() and chat.agent and chat.agent not in registry:
        raise HTTPError(
            404, "AGENT_NOT_FOUND", f"no agent named {chat.agent!r}", session_id=chat.session_id
        )
    return chat


def turn_message(chat: ChatRequest, request_id: str, attributes: dict[str, str]) -> QueueMessage:
    """The INPUT message of a turn: the session (scoped by the sender's identity) is its group,
    its request id the dedup id."""
    return QueueMessage(
        body=chat.model_dump_json(exclude_none=True, exclude={"multitask_strategy"}),
        attributes={ATTR_REQUEST_ID: request_id} | attributes,
        group_id=session_key(chat.session_id, attributes.get(ATTR_USER_ID)),
        dedup_id=request_id,
    )


def poll_location(session_id: str, request_id: str) -> str:
    """The URL path where the reply of ``request_id`` can be read."""
    return f"{CHAT_PATH}/{_quoted(session_id)}?request_id={_quoted(request_id)}"


#: The characters ``quote`` never escapes: a string of only these is its own quoting.
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


def _quoted(text: str) -> str:
    return text if _UNRESERVED.fullmatch(text) else quote(text, safe="")


def wants_async(prefer: str, mode: str) -> bool:
    """Whether the caller is answered 202 at once: ``rest_async`` mode, or ``Prefer:
    respond-async`` (read by tokens, so ``x-respond-async-later`` is not a match)."""
    if mode != "rest_sync":
        return True
    if not prefer:
        return False
    tokens = {token.strip().split("=")[0].strip().lower() for token in prefer.split(",")}
    return "respond-async" in tokens


def traceparent_or_new(header: str) -> str:
    """The caller's W3C trace context, or a new one so the turn can be followed in logs."""
    header = header.strip().lower()
    if _TRACEPARENT.match(header):
        return header
    ids = secrets.token_hex(24)  # trace id and span id from one read of the system's randomness
    return f"00-{ids[:32]}-{ids[32:]}-01"


# -- WebSocket chat frames ---------------------------------------------------------------------

_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:-]{8,128}$")


class FrameError(Exception):
    """A client frame that cannot be served; answered with a ``SYSTEM_RESPONSE`` frame."""

    def __init__(
        self,
        code: str,
        message: str,
        request_id: str | None = None,
        details: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.request_id, self.details = code, request_id, details


def system_response(
    code: str,
    message: str,
    request_id: str | None = None,
    details: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The frame answering a WebSocket frame that cannot be served.

    Args:
        details: the invalid fields, ``[{"field", "message"}]`` as HTTP's 422 carries them.
    """
    frame: dict[str, Any] = {"type": "SYSTEM_RESPONSE", "error": code, "message": message}
    if details:
        frame["details"] = details
    return frame | ({"request_id": request_id} if request_id else {})


@dataclass(frozen=True)
class CancelFrame:
    """A WebSocket frame ``{"route": "cancel", "request_id", "session_id"}``: cancel the turn
    the client named ``request_id`` (in its chat frame) in ``session_id``."""

    session_id: str


def parse_frame(text: str, max_bytes: int) -> tuple[str | None, ChatRequest | CancelFrame]:
    """Read a chat frame ``{"route": "chat", "request_id"?, "body": {...}}`` (or a flat body),
    or a cancel frame (:class:`CancelFrame`).

    Returns:
        the client's id for the turn (``None`` when it sent none) and the chat request, or the
        cancel. The client's id is not the turn's request id: the front derives that from it,
        per identity (:meth:`~agentkernel.pipeline.front.chat_front.ChatFront.socket_request_id`).

    Raises:
        FrameError: the frame is too large, not JSON, for another route, or invalid.
    """
    if len(text.encode()) > max_bytes:
        raise FrameError("FRAME_TOO_LARGE", f"frames are limited to {max_bytes} bytes")
    try:
        frame = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FrameError("INVALID_JSON", f"the frame is not valid JSON: {exc}") from exc
    if not isinstance(frame, dict):
        raise FrameError("INVALID_JSON", "a frame must be a JSON object")
    route = frame.get("route", "chat")
    if route == "cancel":
        return _cancel_frame(frame)
    if route != "chat":
        raise FrameError("UNKNOWN_ROUTE", f"unknown route {str(route)[:64]!r}")
    request_id = _frame_request_id(frame)
    body = (
        frame["body"]
        if "body" in frame
        else {k: v for k, v in frame.items() if k not in ("route", "request_id")}
    )
    if not isinstance(body, dict):
        details = [{"field": "body", "message": "must be a JSON object"}]
        raise FrameError("INVALID_REQUEST", "body: must be a JSON object", request_id, details)
    try:
        return request_id, parse_chat(json.dumps(body).encode())
    except HTTPError as exc:
        raise frame_error(exc, request_id) from exc


def _cancel_frame(frame: dict[str, Any]) -> tuple[str, CancelFrame]:
    request_id = _frame_request_id(frame)
    if request_id is None:
        raise FrameError("INVALID_REQUEST", "a cancel frame needs the turn's request_id")
    body = frame.get("body")
    session_id = (body if isinstance(body, dict) else frame).get("session_id")
    if (
        not isinstance(session_id, str)
        or not _SESSION_ID.fullmatch(session_id)
        or session_id in (".", "..")
    ):
        details = [{"field": "session_id", "message": "required: the turn's session id"}]
        raise FrameError("INVALID_REQUEST", "session_id: required", request_id, details)
    return request_id, CancelFrame(session_id)


def frame_error(exc: HTTPError, request_id: str | None) -> FrameError:
    """The frame refusal an HTTP refusal stands for; its message names the first bad field."""
    details = exc.doc.get("details")
    message = exc.doc["message"]
    if details:
        message = f"{message}: {details[0]['field']}: {details[0]['message']}"
    return FrameError(exc.doc["error"], message, request_id, details)


def _frame_request_id(frame: dict[str, Any]) -> str | None:
    given = frame.get("request_id")
    if given is None:
        return None
    if not isinstance(given, str) or not _CLIENT_REQUEST_ID.match(given):
        raise FrameError("INVALID_REQUEST_ID", "request_id must be 8-128 of A-Z a-z 0-9 _ . : -")
    return given
