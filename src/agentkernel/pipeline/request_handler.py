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
import logging
import re
import secrets
import threading
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.blocking import call
from agentkernel.core.config import AKConfig
from agentkernel.core.errors import MessageRejectedError, StoreError, StoreUnavailableError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.admission import admit, missing_reply
from agentkernel.pipeline.chat import (
    ChatRequest,
    HTTPError,
    check_agent,
    parse_chat,
    request_id_for,
    turn_message,
)
from agentkernel.pipeline.envelope import (
    ATTR_TRACEPARENT,
    ATTR_USER_ID,
    QueueName,
)
from agentkernel.pipeline.http import openapi, sse
from agentkernel.pipeline.http.access_log import AccessLogMiddleware, protect_server_logs
from agentkernel.pipeline.http.auth import IDENTITY, Authenticator, AuthMiddleware
from agentkernel.pipeline.http.errors import install_error_handlers
from agentkernel.pipeline.http.websocket import ChatSocket
from agentkernel.pipeline.process.metrics import METRICS
from agentkernel.pipeline.process.thread_runner import ThreadRunner
from agentkernel.pipeline.response_store import ResponseRecord, ResponseStore
from agentkernel.pipeline.transport.base import QueueTransport

__all__ = ["CHAT_PATH", "ChatRequest", "HTTPError", "RequestHandler", "parse_chat"]

logger = logging.getLogger(__name__)

CHAT_PATH = "/api/v1/chat"
_TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
#: Seconds a client is told to wait before retrying a 503.
RETRY_AFTER_SECONDS = 1


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
        app = FastAPI(
            title="agentkernel",
            version="1",
            docs_url="/docs",
            redoc_url=None,
            redirect_slashes=False,  # a JSON 404, not an empty 307, for "/health/"
        )
        install_error_handlers(app)
        protect_server_logs()
        if self.config.api.auth.enabled:
            app.add_middleware(AuthMiddleware, authenticator=Authenticator(self.config.api.auth))
        if self.config.api.access_log:
            app.add_middleware(AccessLogMiddleware)  # outermost: refused requests are logged too
        app.post(
            CHAT_PATH,
            status_code=200,
            responses=openapi.POST_RESPONSES,
            openapi_extra=openapi.POST_BODY,
        )(self.post_chat)
        app.get(CHAT_PATH + "/{session_id}", responses=openapi.GET_RESPONSES)(self.get_chat)
        app.get(CHAT_PATH + "/{session_id}/stream", responses=openapi.STREAM_RESPONSES)(
            self.get_stream
        )
        app.websocket("/ws")(self.websocket)
        app.get("/api/v1/agents", responses=openapi.PROTECTED_RESPONSES)(self.list_agents)
        app.get("/health")(self.health)
        app.get("/ready", responses=openapi.READY_RESPONSES)(self.ready)
        app.get(
            "/metrics", response_class=PlainTextResponse, responses=openapi.PROTECTED_RESPONSES
        )(self.metrics)
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
        turn = _Turn(chat.session_id, request_id)
        await self._admit(chat, turn)
        if streaming:
            if fresh or not await self._read(turn):
                await self._enqueue(chat, turn, _traceparent(request))
            return self._stream(request_id, chat.session_id)
        if not fresh and (known := await self._read(turn)):
            return _record_response(known, chat.session_id)
        await self._enqueue(chat, turn, _traceparent(request))
        if _wants_async(request, self.config.execution.mode):
            return _accepted(turn)
        record = await self._wait(turn)
        if record is None:
            raise turn.error(504, "TIMEOUT", "no reply within the wait budget; poll for it later")
        return _record_response(record, chat.session_id, location=turn.location)

    async def _admit(self, chat: ChatRequest, turn: _Turn) -> None:
        """Keep the turn's ticket; 422 when its idempotency key was used for other content."""
        await call(self.store.nonblocking, admit, self.store, chat, turn.request_id, IDENTITY.get())

    async def _read(self, turn: _Turn) -> ResponseRecord | None:
        """The stored reply of ``turn``; a store failure becomes an answer saying where to poll."""
        try:
            return await asyncio.to_thread(self.store.get, turn.request_id)
        except StoreError as exc:
            raise self._store_error(turn, exc) from exc

    async def _wait(self, turn: _Turn) -> ResponseRecord | None:
        """Wait for the reply; a shutdown of this process cuts the wait short with a 503."""
        loop = asyncio.get_running_loop()
        released: asyncio.Future[None] = loop.create_future()
        with self._waiters_lock:
            self._waiters[released] = loop
            if self._released:
                released.set_result(None)
        budget = self.config.execution.response_store.sync_wait(
            self.config.api.sync_timeout, self.store.pushes
        )
        waiting = asyncio.ensure_future(self.store.wait(turn.request_id, budget))
        try:
            either: set[asyncio.Future[Any]] = {waiting, released}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if waiting.done():
                return waiting.result()
        except StoreError as exc:
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

    def _store_error(self, turn: _Turn, exc: StoreError) -> HTTPError:
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

    def check_chat(self, chat: ChatRequest) -> ChatRequest:
        """Refuse a turn this process can already tell will fail (unknown agent, shutdown).

        Raises:
            HTTPError: 404 for an unknown agent, 503 while shutting down.
        """
        check_agent(chat, self.registry)
        if ThreadRunner.shutdown_event.is_set():
            raise HTTPError(503, "SHUTTING_DOWN", "the server is shutting down; retry elsewhere")
        return chat

    async def enqueue(self, chat: ChatRequest, request_id: str, traceparent: str = "") -> None:
        """Put a validated turn on the INPUT queue (used by the WebSocket route too).

        Raises:
            HTTPError: 422 for a request id already used for other content, 413 when the broker
                refuses the size, 503 when it does not answer.
        """
        turn = _Turn(chat.session_id, request_id)
        await self._admit(chat, turn)
        await self._enqueue(chat, turn, traceparent or _traceparent(None))

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

    def _request_id(self, request: Request, session_id: str) -> tuple[str, bool]:
        """A fresh id, or one derived from ``Idempotency-Key`` (same key, same turn)."""
        secret = self.config.api.idempotency_secret
        return request_id_for(
            session_id,
            request.headers.get("idempotency-key"),
            IDENTITY.get(),
            None if secret is None else secret.get_secret_value(),
        )

    async def _enqueue(self, chat: ChatRequest, turn: _Turn, traceparent: str) -> None:
        """Put the turn on INPUT, its request id doubling as the broker's dedup id.

        A failed or timed-out send may still have reached the broker, so the 503 carries the
        request id and a Location: polling it, or retrying with the same Idempotency-Key,
        resolves what happened without running the turn twice.
        """
        attributes = {ATTR_TRACEPARENT: traceparent}
        if (user := IDENTITY.get()) is not None:
            attributes[ATTR_USER_ID] = user
        message = turn_message(chat, turn.request_id, attributes)
        timeout = self.config.api.enqueue_timeout
        try:
            if self.transport.nonblocking:  # returns at once: no task, no timer
                self.transport.send(QueueName.INPUT, message)
            else:
                send = asyncio.to_thread(self.transport.send, QueueName.INPUT, message)
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
        turn = _Turn(session_id, request_id)
        record = await self._read(turn)
        if not _readable(record, session_id):
            owner = IDENTITY.get()
            try:
                missing = await call(
                    self.store.nonblocking, missing_reply, self.store, session_id, request_id, owner
                )
            except StoreError as exc:
                raise self._store_error(turn, exc) from exc
            raise missing
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
        if all(v == "ok" for v in results.values()):
            return JSONResponse({"status": "ready", **results})
        down = ", ".join(name for name, v in results.items() if v != "ok")
        doc = {"error": "NOT_READY", "message": f"not answering: {down}", "status": "not_ready"}
        return JSONResponse(doc | results, 503)

    async def metrics(self) -> PlainTextResponse:
        """Prometheus metrics of this process."""
        return PlainTextResponse(METRICS.render(), media_type="text/plain; version=0.0.4")


def poll_location(session_id: str, request_id: str) -> str:
    """The URL path where the reply of ``request_id`` can be read."""
    return f"{CHAT_PATH}/{quote(session_id, safe='')}?request_id={quote(request_id, safe='')}"


def _record_response(
    record: ResponseRecord | None,
    session_id: str,
    request_id: str | None = None,
    location: str | None = None,
) -> JSONResponse:
    if record is None or not _readable(record, session_id):
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


def _readable(record: ResponseRecord | None, session_id: str) -> bool:
    """Whether ``record`` may be shown to this caller under ``session_id``."""
    return (
        record is not None
        and secrets.compare_digest(record.session_id.encode(), session_id.encode())
        and (record.owner is None or record.owner == IDENTITY.get())
    )


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
    return mode != "rest_sync" or "respond-async" in tokens


def _traceparent(request: Request | None) -> str:
    """The caller's W3C trace context, or a new one so the turn can be followed in logs."""
    header = "" if request is None else request.headers.get("traceparent", "").strip().lower()
    if _TRACEPARENT.match(header):
        return header
    ids = secrets.token_hex(24)  # trace id and span id from one read of the system's randomness
    return f"00-{ids[:32]}-{ids[32:]}-01"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
