"""The chat routes of the HTTP API as FastAPI handlers: read the request, ask the front, answer.

``POST /api/v1/chat`` puts a turn on the INPUT queue and answers with its reply (``rest_sync``),
202 (``rest_async`` or ``Prefer: respond-async``) or an event stream (``Accept:
text/event-stream``); ``GET /api/v1/chat/{session_id}?request_id=`` reads a reply until its TTL
ends (upstream's ``GET /api/v1/chat?request_id=&session_id=`` is the same read), and
``.../stream`` resumes a streamed one, and ``POST .../cancel?request_id=`` cancels a queued or
running turn. ``/api/v1/sessions`` lists the caller's sessions, and
``/api/v1/sessions/{session_id}`` shows (``GET``) or erases (``DELETE``) one. What each answers
is decided by :class:`~agentkernel.pipeline.front.chat_front.ChatFront`; this module only
translates.
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from agentkernel.pipeline.front.chat_front import Answer, ChatCall, ChatFront, StreamAnswer
from agentkernel.pipeline.http import sse
from agentkernel.pipeline.http.auth import IDENTITY
from agentkernel.pipeline.http.errors import error_response
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.wire.chat import HTTPError


class ChatRoutes:
    """The FastAPI handlers of the chat routes over one front."""

    def __init__(self, front: ChatFront) -> None:
        self.front = front

    async def post_chat(self, request: Request) -> Response:
        """Enqueue a chat turn; answer with the reply (sync), 202 (async) or a stream."""
        headers = _headers(request)
        try:
            body = await self._read_body(request, headers.get("content-length", ""))
        except HTTPError as exc:
            METRICS.inc("agentkernel_http_requests_total", status=str(exc.status))
            raise
        chat_call = ChatCall(
            body=body,
            identity=IDENTITY.get(),
            idempotency_key=headers.get("idempotency-key"),
            prefer=headers.get("prefer", ""),
            traceparent=headers.get("traceparent", ""),
            stream=sse.wants_stream(headers.get("accept", "")),
        )
        return self._response(await self.front.post_chat(chat_call))

    async def post_chat_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """:meth:`post_chat` as a bare ASGI application (see :class:`~.app.AgentAPI`)."""
        try:
            response = await self.post_chat(Request(scope, receive))
        except HTTPError as exc:
            response = error_response(exc)
        await response(scope, receive, send)

    async def get_chat(self, session_id: str, request_id: str | None = None) -> Response:
        """The reply of ``request_id`` once it is ready; 404 before, or under another session."""
        return self._response(await self.front.get_chat(session_id, request_id, IDENTITY.get()))

    async def poll_chat(
        self, request_id: str | None = None, session_id: str | None = None
    ) -> Response:
        """Upstream's poll form, ``GET /api/v1/chat?request_id=&session_id=``: the same read as
        :meth:`get_chat`, the session taken from the query (required here)."""
        return self._response(await self.front.get_chat(session_id, request_id, IDENTITY.get()))

    async def cancel_chat(self, session_id: str, request_id: str | None = None) -> Response:
        """Cancel a queued or running turn: 200 once stopped, 202 while asked, 409 if it had
        already answered."""
        answer = await self.front.cancel(session_id, request_id, IDENTITY.get())
        return json_response(answer)

    async def get_stream(self, request: Request, session_id: str, request_id: str = "") -> Response:
        """Resume a streamed turn: the chunks after ``Last-Event-ID``, then live ones."""
        after = sse.last_event_id(request.headers.get("last-event-id"))
        answer = await self.front.resume_stream(session_id, request_id, IDENTITY.get(), after)
        return self._response(answer)

    def _response(self, answer: Answer | StreamAnswer) -> Response:
        if isinstance(answer, StreamAnswer):
            return sse.stream_response(self.front.frames(answer), answer.request_id, answer.after)
        return json_response(answer)

    async def _read_body(self, request: Request, declared: str) -> bytes:
        """The body, refused past ``api.max_body_bytes`` or ``api.body_timeout`` seconds.

        Args:
            declared: the request's ``Content-Length`` header ("" without one).
        """
        api = self.front.config.api
        limit = api.max_body_bytes
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks, size = [], 0
        try:
            async with asyncio.timeout(api.body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(limit)
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise HTTPError(
                408,
                "BODY_TIMEOUT",
                f"the request body did not arrive within {api.body_timeout}s",
                {"Connection": "close"},
            ) from exc
        return b"".join(chunks)


def _headers(request: Request) -> dict[str, str]:
    """The request's headers by (lower-case) name, the first of a repeated one winning, as
    ``request.headers.get`` reads them: one pass instead of one scan per header read."""
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in reversed(request.scope["headers"])
    }


def _too_large(limit: int) -> HTTPError:
    return HTTPError(413, "BODY_TOO_LARGE", f"request body exceeds {limit} bytes")


class SessionRoutes:
    """The FastAPI handlers of the sessions routes over one front."""

    def __init__(self, front: ChatFront) -> None:
        self.front = front

    async def list_sessions(self, limit: str | None = None, cursor: str | None = None) -> Response:
        """The caller's sessions, newest activity first; ``next_cursor`` pages on."""
        return answer_response(await self.front.list_sessions(IDENTITY.get(), limit, cursor))

    async def show_session(self, session_id: str) -> Response:
        """One of the caller's sessions: its state, its recent turns and its last reply."""
        return answer_response(await self.front.show_session(session_id, IDENTITY.get()))

    async def delete_session(self, session_id: str) -> Response:
        """Erase one of the caller's sessions (state, tickets, replies, chunks); 204 always."""
        return answer_response(await self.front.delete_session(session_id, IDENTITY.get()))


def answer_response(answer: Answer) -> Response:
    """An :class:`Answer` as a response: JSON, or no body at all for a 204."""
    if answer.status == 204:
        return Response(status_code=204, headers=answer.headers or None)
    return json_response(answer)


def json_response(answer: Answer) -> JSONResponse:
    """An :class:`Answer` as FastAPI's JSON response."""
    return JSONResponse(answer.doc, status_code=answer.status, headers=answer.headers or None)
