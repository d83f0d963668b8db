"""The chat WebSocket (``/ws``): many turns of many sessions over one connection.

Client frames are JSON objects ``{"route": "chat", "request_id"?: str, "body": {"session_id",
"prompt", "agent"?, "stream"?: bool}}``; a flat frame without ``body`` is read as the body itself.
The server answers ``CHAT_QUEUED`` once the turn is on the queue, then either ``CHAT_RESPONSE``
or ``STREAM_CHUNK`` frames ending with ``done``. Anything wrong with a frame is answered with a
``SYSTEM_RESPONSE`` and the connection stays open; closing it mid-turn leaves the turn running.
``{"route": "cancel", "request_id", "session_id"}`` cancels a turn the client sent (named by its
own ``request_id``): answered ``CANCEL_RESPONSE``, then the turn's ``CHAT_RESPONSE`` (409
``CANCELLED``) as usual.

A client's ``request_id`` is its own name for the turn, echoed in every frame about it; the
turn's request id is derived from it per identity (see :meth:`ChatFront.socket_request_id`).
When the connection's credential expires the socket gets a ``SYSTEM_RESPONSE``
``CREDENTIAL_EXPIRED`` and is closed with code :data:`CLOSE_CREDENTIAL_EXPIRED`; no frame is
served after that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from starlette.types import Message

from agentkernel.pipeline.front.chat_front import ChatFront, StreamAnswer
from agentkernel.pipeline.front.turn_control import cancel_frame
from agentkernel.pipeline.http.auth import EXPIRES_AT, IDENTITY
from agentkernel.pipeline.http.subprotocols import selected
from agentkernel.pipeline.wire.chat import (
    CancelFrame,
    ChatRequest,
    FrameError,
    HTTPError,
    frame_error,
    parse_frame,
    system_response,
)

logger = logging.getLogger(__name__)

#: Close code of a socket whose credential expired (a private code, like HTTP 401).
CLOSE_CREDENTIAL_EXPIRED = 4401


class ChatSocket:
    """Serves one WebSocket connection over a :class:`ChatFront`."""

    def __init__(self, handler: ChatFront, websocket: WebSocket) -> None:
        self.handler, self.ws = handler, websocket
        self.api = handler.config.api
        self._send_lock = asyncio.Lock()
        self._turns: set[asyncio.Task[None]] = set()
        self.identity, self.expires_at = IDENTITY.get(), EXPIRES_AT.get()

    async def serve(self) -> None:
        # agentkernel.v1 when offered; never a credential subprotocol (see .subprotocols)
        await self.ws.accept(subprotocol=selected(self.ws.scope.get("subprotocols", [])))
        try:
            while True:
                message = await self._receive()
                if message is None or message["type"] == "websocket.disconnect":
                    return
                text = message.get("text")
                if text is None and message.get("bytes") is not None:
                    text = message["bytes"].decode("utf-8", "replace")
                await self._on_frame(text or "")
        except WebSocketDisconnect:
            return
        finally:
            for task in self._turns:  # the turns themselves go on in the runners
                task.cancel()

    async def _receive(self) -> Message | None:
        """The next client message; ``None`` once the credential expired (socket closed)."""
        if self.expires_at is None:
            return await self.ws.receive()
        try:
            async with asyncio.timeout(max(self.expires_at - time.time(), 0.0)):
                message = await self.ws.receive()
        except TimeoutError:
            await self._expire()
            return None
        if time.time() >= self.expires_at:  # checked for every frame, whenever it arrived
            await self._expire()
            return None
        return message

    async def _expire(self) -> None:
        message = "the credential of this connection expired; reconnect with a fresh one"
        await self._try_send(system_response("CREDENTIAL_EXPIRED", message))
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await self.ws.close(CLOSE_CREDENTIAL_EXPIRED, "credential expired")

    async def _on_frame(self, text: str) -> None:
        client_id = None
        try:
            client_id, chat = parse_frame(text, self.api.max_body_bytes)
            if isinstance(chat, CancelFrame):
                await self._cancel(chat, client_id)
                return
            chat = self._check(chat, client_id)
            if len(self._turns) >= self.api.ws_max_turns:
                raise FrameError(
                    "TOO_MANY_TURNS",
                    f"at most {self.api.ws_max_turns} turns may be open on one connection",
                    client_id,
                )
            front, identity = self.handler, self.identity
            request_id = await front.socket_request_id(client_id, identity)
            await front.enqueue(chat, request_id, identity=identity)
        except FrameError as exc:
            shown = exc.request_id or client_id
            await self.send(system_response(exc.code, str(exc), shown, exc.details))
            return
        except Exception as exc:  # an HTTPError from validation or the enqueue
            doc = getattr(exc, "doc", {"error": "INTERNAL", "message": "the turn failed"})
            await self.send(system_response(doc["error"], doc["message"], client_id))
            return
        shown = client_id or request_id  # the client's own name for the turn, in every frame
        queued = {"type": "CHAT_QUEUED", "request_id": shown, "session_id": chat.session_id}
        await self.send(queued)
        task = asyncio.create_task(self._answer(chat, request_id, shown))
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)

    async def _cancel(self, cancel: CancelFrame, client_id: str | None) -> None:
        """Answer a cancel frame with ``CANCEL_RESPONSE`` (the front's answer as a frame); the
        turn's own frame (``CHAT_RESPONSE`` 409 ``CANCELLED``) follows as usual."""
        front, identity = self.handler, self.identity
        request_id = await front.socket_request_id(client_id, identity)
        answer = await front.cancel(cancel.session_id, request_id, identity)
        await self.send(cancel_frame(answer, client_id or request_id, cancel.session_id))

    def _check(self, chat: ChatRequest, request_id: str | None) -> ChatRequest:
        try:
            return self.handler.check_chat(chat)
        except HTTPError as exc:
            raise frame_error(exc, request_id) from exc

    async def _answer(self, chat: ChatRequest, request_id: str, shown: str) -> None:
        try:
            if chat.stream:
                await self._stream(chat, request_id, shown)
            else:
                await self._reply(chat, request_id, shown)
        except (WebSocketDisconnect, RuntimeError):
            logger.debug("socket closed before turn %s was answered", request_id)
        except Exception as exc:
            logger.warning("answering turn %s over WebSocket failed: %r", request_id, exc)
            await self._try_send(system_response("STORE_UNAVAILABLE", str(exc), shown))

    async def _stream(self, chat: ChatRequest, request_id: str, shown: str) -> None:
        stream = StreamAnswer(request_id, chat.session_id, owner=self.identity)
        async for frame in self.handler.frames(stream):
            if frame is not None:
                await self.send(frame | {"request_id": shown})

    async def _reply(self, chat: ChatRequest, request_id: str, shown: str) -> None:
        record = await self.handler.wait_reply(request_id)
        if record is None:
            message = "no reply within the wait budget; poll for it with the request_id"
            await self.send(system_response("TIMEOUT", message, shown))
            return
        if not record.visible_to(chat.session_id, self.identity):
            await self.send(system_response("NOT_FOUND", "no such turn in this session", shown))
            return
        await asyncio.to_thread(self.handler.quota.read, record)
        frame = {
            "type": "CHAT_RESPONSE",
            "request_id": shown,
            "session_id": record.session_id,
            "status_code": record.status_code,
        }
        await self.send(frame | {k: v for k, v in record.body.items() if k not in frame})

    async def send(self, frame: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(frame))

    async def _try_send(self, frame: dict[str, Any]) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await self.send(frame)
