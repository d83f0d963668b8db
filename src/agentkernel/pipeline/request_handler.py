"""The HTTP front: chat turns in, replies out (FastAPI).

``POST /api/v1/chat`` validates the turn, puts it on the INPUT queue and either waits for the reply
(``rest_sync``) or answers 202 at once (``rest_async``, or ``Prefer: respond-async``).
``GET /api/v1/chat/{session_id}?request_id=...`` reads a reply as often as needed until its TTL
ends. Bad input is answered with a 4xx JSON error and never enqueued.

Every answer to a POST that may have enqueued its turn (200, 202, 503 after a failed or timed-out
send, 503 for a store outage or a shutdown, 504) carries the turn's ``request_id`` and a
``Location`` to poll, so the client can always find out what became of it. A request id derived
from ``Idempotency-Key`` is also the broker's dedup id: a retry with the same key never runs the
turn twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import threading
import uuid
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config import AKConfig
from agentkernel.core.errors import MessageRejectedError, ResponseStoreError, StoreUnavailableError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.blocking import call
from agentkernel.pipeline.envelope import (
    ATTR_REQUEST_ID,
    ATTR_TRACEPARENT,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.metrics import METRICS
from agentkernel.pipeline.response_store import ResponseRecord, ResponseStore
from agentkernel.pipeline.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.base import QueueTransport

logger = logging.getLogger(__name__)

CHAT_PATH = "/api/v1/chat"
_TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
_IDEMPOTENCY_NS = uuid.UUID("6f1c3a4e-8f7d-4c1b-9a55-2f3e0b7c9d10")
#: Seconds a client is told to wait before retrying a 503.
RETRY_AFTER_SECONDS = 1


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


class _Turn:
    """What a POST knows about the turn it enqueued: enough for the client to find it again."""

    def __init__(self, session_id: str, request_id: str) -> None:
        self.session_id = session_id
        self.request_id = request_id

    @property
    def location(self) -> str:
        return poll_location(self.session_id, self.request_id)

    def error(self, status: int, code: str, message: str) -> HTTPError:
        """An error answer that says where to poll for this turn's reply."""
        headers = {"Location": self.location}
        if status == 503:
            headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return HTTPError(
            status,
            code,
            message,
            headers,
            request_id=self.request_id,
            session_id=self.session_id,
        )


class RequestHandler:
    """Builds the FastAPI application over a transport and a response store.

    Args:
        transport: where turns are enqueued.
        store: where replies are read.
        config: settings; default the process-wide :class:`AKConfig`.
        registry: agents known to this process, used to reject unknown agent names early
            (an IO process without agents leaves that check to the runner, which answers 404).
    """

    def __init__(
        self,
        transport: QueueTransport,
        store: ResponseStore,
        config: AKConfig | None = None,
        registry: AgentRegistry | None = None,
    ) -> None:
        self.transport = transport
        self.store = store
        self.config = config if config is not None else AKConfig.get()
        self.registry = registry if registry is not None else AgentRegistry.default()
        self._log = RateLimitedLog(logger)
        self._waiters: dict[asyncio.Future[None], asyncio.AbstractEventLoop] = {}
        self._waiters_lock = threading.Lock()
        self._released = False

    # -- shutdown -------------------------------------------------------------------------------

    def waiting(self) -> int:
        """How many ``rest_sync`` requests are waiting for their reply right now."""
        with self._waiters_lock:
            return len(self._waiters)

    def release_waiters(self) -> None:
        """Answer every waiting ``rest_sync`` request (and later ones) with 503 at once.

        Called from any thread by a process that is shutting down: each caller gets its
        ``request_id`` and a ``Location`` to poll instead of a dropped connection.
        """
        with self._waiters_lock:
            self._released = True
            waiters = list(self._waiters.items())
        for future, loop in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def build_app(self) -> FastAPI:
        """The application with every route of the HTTP API."""
        app = FastAPI(title="agentkernel", version="1", docs_url="/docs", redoc_url=None)
        app.add_exception_handler(HTTPError, _http_error)  # type: ignore[arg-type]
        app.add_exception_handler(Exception, _internal_error)
        app.post(CHAT_PATH, status_code=200, responses=_POST_RESPONSES, openapi_extra=_POST_BODY)(
            self.post_chat
        )
        app.get(CHAT_PATH + "/{session_id}", responses=_GET_RESPONSES)(self.get_chat)
        app.get("/api/v1/agents")(self.list_agents)
        app.get("/health")(self.health)
        app.get("/ready")(self.ready)
        app.get("/metrics", response_class=PlainTextResponse)(self.metrics)
        return app

    # -- chat ---------------------------------------------------------------------------------

    async def post_chat(self, request: Request) -> Response:
        """Enqueue a chat turn; answer with the reply (sync) or 202 (async)."""
        try:
            return await self._post_chat(request)
        except HTTPError as exc:
            METRICS.inc("agentkernel_http_requests_total", status=str(exc.status))
            raise

    async def _post_chat(self, request: Request) -> Response:
        chat = parse_chat(await self._read_body(request))
        if self.registry.agents() and chat.agent and chat.agent not in self.registry:
            raise HTTPError(
                404, "AGENT_NOT_FOUND", f"no agent named {chat.agent!r}", session_id=chat.session_id
            )
        if ThreadRunner.shutdown_event.is_set():
            raise HTTPError(503, "SHUTTING_DOWN", "the server is shutting down; retry elsewhere")
        request_id, fresh = self._request_id(request, chat.session_id)
        turn = _Turn(chat.session_id, request_id)
        if not fresh and (known := await self._read(turn)):
            return _record_response(known, chat.session_id)
        await self._enqueue(chat, turn, _traceparent(request))
        if _wants_async(request, self.config.execution.mode):
            return _accepted(turn)
        record = await self._wait(turn)
        if record is None:
            raise turn.error(504, "TIMEOUT", "no reply within the wait budget; poll for it later")
        return _record_response(record, chat.session_id, location=turn.location)

    async def _read(self, turn: _Turn) -> ResponseRecord | None:
        """The stored reply of ``turn``; a store failure becomes an answer saying where to poll."""
        try:
            return await asyncio.to_thread(self.store.get, turn.request_id)
        except ResponseStoreError as exc:
            raise self._store_error(turn, exc) from exc

    async def _wait(self, turn: _Turn) -> ResponseRecord | None:
        """Wait for the reply; a shutdown of this process cuts the wait short with a 503."""
        loop = asyncio.get_running_loop()
        released: asyncio.Future[None] = loop.create_future()
        with self._waiters_lock:
            self._waiters[released] = loop
            if self._released:
                released.set_result(None)
        waiting = asyncio.ensure_future(
            self.store.wait(turn.request_id, self.config.api.sync_timeout)
        )
        try:
            either: set[asyncio.Future[Any]] = {waiting, released}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if waiting.done():
                return waiting.result()
        except ResponseStoreError as exc:
            raise self._store_error(turn, exc) from exc
        finally:
            waiting.cancel()
            with self._waiters_lock:
                self._waiters.pop(released, None)
        raise turn.error(
            503,
            "SHUTTING_DOWN",
            "the server is shutting down; the turn is queued, poll the Location for its reply",
        )

    def _store_error(self, turn: _Turn, exc: ResponseStoreError) -> HTTPError:
        self._log.log(
            logging.WARNING,
            f"store:{type(exc).__name__}",
            "response store failed for request %s: %s",
            turn.request_id,
            exc,
        )
        if isinstance(exc, StoreUnavailableError):
            message = "the reply store is unreachable; retry or poll the Location later"
            return turn.error(503, "STORE_UNAVAILABLE", message)
        return turn.error(500, "STORE_ERROR", "the reply store failed; poll the Location later")

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.api.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, "BODY_TOO_LARGE", f"request body exceeds {limit} bytes")
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.config.api.body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise HTTPError(
                            413, "BODY_TOO_LARGE", f"request body exceeds {limit} bytes"
                        )
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise HTTPError(
                408,
                "BODY_TIMEOUT",
                f"the request body did not arrive within {self.config.api.body_timeout}s",
                {"Connection": "close"},
            ) from exc
        return b"".join(chunks)

    @staticmethod
    def _request_id(request: Request, session_id: str) -> tuple[str, bool]:
        """A fresh id, or one derived from ``Idempotency-Key`` (same key, same turn)."""
        key = request.headers.get("idempotency-key")
        if key is None:
            return uuid.uuid4().hex, True
        if not 1 <= len(key) <= 255:
            raise HTTPError(400, "INVALID_IDEMPOTENCY_KEY", "Idempotency-Key must be 1-255 chars")
        return uuid.uuid5(_IDEMPOTENCY_NS, f"{session_id}\n{key}").hex, False

    async def _enqueue(self, chat: ChatRequest, turn: _Turn, traceparent: str) -> None:
        """Put the turn on INPUT, its request id doubling as the broker's dedup id.

        A failed or timed-out send may still have reached the broker, so the 503 carries the
        request id and a Location: polling it, or retrying with the same Idempotency-Key,
        resolves what happened without running the turn twice.
        """
        message = QueueMessage(
            body=chat.model_dump_json(exclude_none=True),
            attributes={ATTR_REQUEST_ID: turn.request_id, ATTR_TRACEPARENT: traceparent},
            group_id=chat.session_id,
            dedup_id=turn.request_id,
        )
        timeout = self.config.api.enqueue_timeout
        send = call(self.transport.nonblocking, self.transport.send, QueueName.INPUT, message)
        try:
            await asyncio.wait_for(send, timeout)
        except MessageRejectedError as exc:
            raise HTTPError(413, "MESSAGE_TOO_LARGE", str(exc), session_id=chat.session_id) from exc
        except Exception as exc:
            self._log.log(
                logging.WARNING,
                f"enqueue:{type(exc).__name__}",
                "enqueue of request %s failed: %r",
                turn.request_id,
                exc,
            )
            raise turn.error(
                503,
                "QUEUE_UNAVAILABLE",
                "the turn may not have been queued; retry with the same Idempotency-Key, or "
                "poll the Location to see whether it ran",
            ) from exc

    async def get_chat(self, session_id: str, request_id: str | None = None) -> Response:
        """The reply of ``request_id`` once it is ready; 404 before, or under another session."""
        if not request_id:
            raise HTTPError(400, "INVALID_REQUEST", "the request_id query parameter is required")
        record = await self._read(_Turn(session_id, request_id))
        return _record_response(record, session_id, request_id=request_id)

    # -- service routes -------------------------------------------------------------------------

    async def list_agents(self) -> dict[str, Any]:
        """The agents registered in this process."""
        agents = [
            {"name": a.name, "description": a.description, "streaming": a.streaming}
            for a in self.registry.agents()
        ]
        return {"agents": agents}

    async def health(self) -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    async def ready(self) -> JSONResponse:
        """Readiness: the broker and the response store answer."""
        checks = {"queue": self.transport.ping, "response_store": self.store.ping}
        results: dict[str, str] = {}
        for name, check in checks.items():
            try:
                await asyncio.wait_for(asyncio.to_thread(check), 5.0)
                results[name] = "ok"
            except Exception as exc:
                results[name] = f"unavailable: {type(exc).__name__}"
        ok = all(v == "ok" for v in results.values())
        return JSONResponse(
            {"status": "ready" if ok else "not_ready", **results}, 200 if ok else 503
        )

    async def metrics(self) -> PlainTextResponse:
        """Prometheus metrics of this process."""
        return PlainTextResponse(METRICS.render(), media_type="text/plain; version=0.0.4")


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


def poll_location(session_id: str, request_id: str) -> str:
    """The URL path where the reply of ``request_id`` can be read."""
    return f"{CHAT_PATH}/{quote(session_id, safe='')}?request_id={quote(request_id, safe='')}"


def _record_response(
    record: ResponseRecord | None,
    session_id: str,
    request_id: str | None = None,
    location: str | None = None,
) -> JSONResponse:
    if record is None or not secrets.compare_digest(
        record.session_id.encode(), session_id.encode()
    ):
        raise HTTPError(
            404,
            "NOT_FOUND",
            "no reply for this request in this session (yet)",
            request_id=request_id or "",
            session_id=session_id,
        )
    METRICS.inc("agentkernel_http_requests_total", status=str(record.status_code))
    headers = {"Content-Location": location} if location else None
    return JSONResponse(record.body, status_code=record.status_code, headers=headers)


def _accepted(turn: _Turn) -> JSONResponse:
    METRICS.inc("agentkernel_http_requests_total", status="202")
    return JSONResponse(
        {"status": "ACCEPTED", "request_id": turn.request_id, "session_id": turn.session_id},
        status_code=202,
        headers={"Location": turn.location, "Preference-Applied": "respond-async"},
    )


def _wants_async(request: Request, mode: str) -> bool:
    prefer = request.headers.get("prefer", "")
    tokens = {token.strip().split("=")[0].lower() for token in prefer.split(",")}
    return mode == "rest_async" or "respond-async" in tokens


def _traceparent(request: Request) -> str:
    """The caller's W3C trace context, or a new one so the turn can be followed in logs."""
    header = request.headers.get("traceparent", "").strip().lower()
    if _TRACEPARENT.match(header):
        return header
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
    return JSONResponse(exc.doc, status_code=exc.status, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug or an unmapped failure: JSON like every other error, never a traceback."""
    METRICS.inc("agentkernel_http_requests_total", status="500")
    return JSONResponse({"error": "INTERNAL_ERROR", "message": "unexpected server error"}, 500)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_ERROR = {"content": {"application/json": {"example": {"error": "CODE", "message": "why"}}}}
_POST_BODY = {
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
_POST_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The reply: result, session_id, request_id, agent."},
    202: {"description": "Queued (async): status ACCEPTED, request_id, session_id."},
    400: {"description": "Body is not a JSON object.", **_ERROR},
    404: {"description": "Unknown agent.", **_ERROR},
    413: {"description": "Body larger than api.max_body_bytes.", **_ERROR},
    422: {"description": "Missing or invalid fields.", **_ERROR},
    408: {"description": "The body did not arrive within api.body_timeout.", **_ERROR},
    500: {"description": "The agent failed; the body explains.", **_ERROR},
    503: {
        "description": "Queue or reply store unavailable, or shutting down; when the turn may "
        "have been queued, request_id and a Location to poll are included.",
        **_ERROR,
    },
    504: {"description": "No reply in time; poll the Location.", **_ERROR},
}
_GET_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The reply."},
    404: {"description": "Not ready yet, unknown, or another session's reply.", **_ERROR},
    503: {"description": "The reply store is unreachable; retry later.", **_ERROR},
}
