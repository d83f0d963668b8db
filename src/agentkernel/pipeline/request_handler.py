"""The HTTP front: chat turns in, replies out (FastAPI).

``POST /api/v1/chat`` validates the turn, puts it on the INPUT queue and either waits for the reply
(``rest_sync``) or answers 202 at once (``rest_async``, or ``Prefer: respond-async``).
``GET /api/v1/chat/{session_id}?request_id=...`` reads a reply as often as needed until its TTL
ends. Bad input is answered with a 4xx JSON error and never enqueued.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config import AKConfig
from agentkernel.core.errors import MessageRejectedError
from agentkernel.pipeline.blocking import call
from agentkernel.pipeline.chat import (
    ChatRequest,
    HTTPError,
    parse_chat,
    request_id_for,
)
from agentkernel.pipeline.envelope import (
    ATTR_REQUEST_ID,
    ATTR_TRACEPARENT,
    ATTR_USER_ID,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.http import sse
from agentkernel.pipeline.http.auth import IDENTITY, Authenticator, AuthMiddleware
from agentkernel.pipeline.http.websocket import ChatSocket
from agentkernel.pipeline.metrics import METRICS
from agentkernel.pipeline.response_store import ResponseRecord, ResponseStore
from agentkernel.pipeline.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.base import QueueTransport

__all__ = ["CHAT_PATH", "ChatRequest", "HTTPError", "RequestHandler", "parse_chat"]

logger = logging.getLogger(__name__)

CHAT_PATH = "/api/v1/chat"
_TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


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

    def build_app(self) -> FastAPI:
        """The application with every route of the HTTP API."""
        app = FastAPI(title="agentkernel", version="1", docs_url="/docs", redoc_url=None)
        app.add_exception_handler(HTTPError, _http_error)  # type: ignore[arg-type]
        if self.config.api.auth.enabled:
            app.add_middleware(AuthMiddleware, authenticator=Authenticator(self.config.api.auth))
        app.post(CHAT_PATH, status_code=200, responses=_POST_RESPONSES, openapi_extra=_POST_BODY)(
            self.post_chat
        )
        app.get(CHAT_PATH + "/{session_id}", responses=_GET_RESPONSES)(self.get_chat)
        app.get(CHAT_PATH + "/{session_id}/stream", responses=_STREAM_RESPONSES)(self.get_stream)
        app.websocket("/ws")(self.websocket)
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
        chat = self.check_chat(parse_chat(await self._read_body(request)))
        streaming = sse.wants_stream(request.headers.get("accept", ""))
        chat.stream = chat.stream or streaming
        request_id, fresh = self._request_id(request, chat.session_id)
        if streaming:
            if fresh or not await asyncio.to_thread(self.store.get, request_id):
                await self._enqueue(chat, request_id, _traceparent(request))
            return self._stream(request_id, chat.session_id)
        if not fresh and (known := await asyncio.to_thread(self.store.get, request_id)):
            return _record_response(known, chat.session_id)
        await self._enqueue(chat, request_id, _traceparent(request))
        if _wants_async(request, self.config.execution.mode):
            return _accepted(chat.session_id, request_id)
        budget = self.config.execution.response_store.sync_wait(
            self.config.api.sync_timeout, self.store.pushes
        )
        record = await self.store.wait(request_id, budget)
        if record is None:
            raise HTTPError(
                504,
                "TIMEOUT",
                "no reply within the wait budget; poll for it later",
                request_id=request_id,
                session_id=chat.session_id,
            )
        return _record_response(record, chat.session_id)

    def check_chat(self, chat: ChatRequest) -> ChatRequest:
        """Refuse a turn this process can already tell will fail (unknown agent, shutdown).

        Raises:
            HTTPError: 404 for an unknown agent, 503 while shutting down.
        """
        if self.registry.agents() and chat.agent and chat.agent not in self.registry:
            raise HTTPError(
                404, "AGENT_NOT_FOUND", f"no agent named {chat.agent!r}", session_id=chat.session_id
            )
        if ThreadRunner.shutdown_event.is_set():
            raise HTTPError(503, "SHUTTING_DOWN", "the server is shutting down; retry elsewhere")
        return chat

    async def enqueue(self, chat: ChatRequest, request_id: str, traceparent: str = "") -> None:
        """Put a validated turn on the INPUT queue (used by the WebSocket route too).

        Raises:
            HTTPError: 413 when the broker refuses the size, 503 when it does not answer.
        """
        await self._enqueue(chat, request_id, traceparent or _traceparent(None))

    def _stream(self, request_id: str, session_id: str, after: int = -1) -> Response:
        api = self.config.api
        return sse.stream_response(
            self.store,
            request_id,
            session_id,
            after=after,
            heartbeat=api.stream_heartbeat,
            idle_timeout=api.sync_timeout,
            owner=IDENTITY.get(),
        )

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.api.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, "BODY_TOO_LARGE", f"request body exceeds {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, "BODY_TOO_LARGE", f"request body exceeds {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _request_id(self, request: Request, session_id: str) -> tuple[str, bool]:
        """A fresh id, or one derived from ``Idempotency-Key`` (same key, same turn)."""
        secret = self.config.api.idempotency_secret
        return request_id_for(
            session_id,
            request.headers.get("idempotency-key"),
            IDENTITY.get(),
            None if secret is None else secret.get_secret_value(),
        )

    async def _enqueue(self, chat: ChatRequest, request_id: str, traceparent: str) -> None:
        message = QueueMessage(
            body=chat.model_dump_json(exclude_none=True),
            attributes={ATTR_REQUEST_ID: request_id, ATTR_TRACEPARENT: traceparent}
            | ({ATTR_USER_ID: user} if (user := IDENTITY.get()) is not None else {}),
            group_id=chat.session_id,
            dedup_id=request_id,
        )
        timeout = self.config.api.enqueue_timeout
        send = call(self.transport.nonblocking, self.transport.send, QueueName.INPUT, message)
        try:
            await asyncio.wait_for(send, timeout)
        except MessageRejectedError as exc:
            raise HTTPError(413, "MESSAGE_TOO_LARGE", str(exc), session_id=chat.session_id) from exc
        except Exception as exc:
            logger.warning("enqueue of request %s failed: %r", request_id, exc)
            raise HTTPError(
                503,
                "QUEUE_UNAVAILABLE",
                "the turn could not be queued; retry later",
                session_id=chat.session_id,
            ) from exc

    async def get_chat(self, session_id: str, request_id: str | None = None) -> Response:
        """The reply of ``request_id`` once it is ready; 404 before, or under another session."""
        if not request_id:
            raise HTTPError(400, "INVALID_REQUEST", "the request_id query parameter is required")
        record = await asyncio.to_thread(self.store.get, request_id)
        return _record_response(record, session_id, request_id=request_id)

    async def get_stream(self, request: Request, session_id: str, request_id: str = "") -> Response:
        """Resume a streamed turn: the chunks after ``Last-Event-ID``, then live ones."""
        if not request_id:
            raise HTTPError(400, "INVALID_REQUEST", "the request_id query parameter is required")
        after = sse.last_event_id(request.headers.get("last-event-id"))
        return self._stream(request_id, session_id, after)

    async def websocket(self, websocket: WebSocket) -> None:
        """The chat WebSocket: ``CHAT_QUEUED``, then ``CHAT_RESPONSE`` or chunk frames."""
        await ChatSocket(self, websocket).serve()

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


def _record_response(
    record: ResponseRecord | None, session_id: str, request_id: str | None = None
) -> JSONResponse:
    if (
        record is None
        or not secrets.compare_digest(record.session_id.encode(), session_id.encode())
        or (record.owner is not None and record.owner != IDENTITY.get())
    ):
        raise HTTPError(
            404,
            "NOT_FOUND",
            "no reply for this request in this session (yet)",
            request_id=request_id or "",
            session_id=session_id,
        )
    METRICS.inc("agentkernel_http_requests_total", status=str(record.status_code))
    return JSONResponse(record.body, status_code=record.status_code)


def _accepted(session_id: str, request_id: str) -> JSONResponse:
    METRICS.inc("agentkernel_http_requests_total", status="202")
    return JSONResponse(
        {"status": "ACCEPTED", "request_id": request_id, "session_id": session_id},
        status_code=202,
        headers={
            "Location": f"{CHAT_PATH}/{quote(session_id, safe='')}?request_id={request_id}",
            "Preference-Applied": "respond-async",
        },
    )


def _wants_async(request: Request, mode: str) -> bool:
    prefer = request.headers.get("prefer", "")
    tokens = {token.strip().split("=")[0].lower() for token in prefer.split(",")}
    return mode != "rest_sync" or "respond-async" in tokens


def _traceparent(request: Request | None) -> str:
    """The caller's W3C trace context, or a new one so the turn can be followed in logs."""
    header = "" if request is None else request.headers.get("traceparent", "").strip().lower()
    if _TRACEPARENT.match(header):
        return header
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
    return JSONResponse(exc.doc, status_code=exc.status)


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
    200: {
        "description": "The reply: result, session_id, request_id, agent; with 'Accept: "
        "text/event-stream', a stream of STREAM_CHUNK frames ending with a done frame."
    },
    202: {"description": "Queued (async): status ACCEPTED, request_id, session_id."},
    400: {"description": "Body is not a JSON object.", **_ERROR},
    404: {"description": "Unknown agent.", **_ERROR},
    413: {"description": "Body larger than api.max_body_bytes.", **_ERROR},
    422: {"description": "Missing or invalid fields.", **_ERROR},
    500: {"description": "The agent failed; the body explains.", **_ERROR},
    503: {"description": "The queue did not accept the turn.", **_ERROR},
    504: {"description": "No reply in time; poll with the request_id.", **_ERROR},
}
_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "text/event-stream of STREAM_CHUNK frames after Last-Event-ID, then done.",
        "content": {"text/event-stream": {}},
    },
}
_GET_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The reply."},
    404: {"description": "Not ready yet, unknown, or another session's reply.", **_ERROR},
}
