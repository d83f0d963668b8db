"""The chat front, written once: every adapter (FastAPI, ``/ws``, Lambda) only translates.

:class:`ChatFront` takes what an adapter read from its request (a :class:`ChatCall`, or a session
and request id) and returns an :class:`Answer` (status, JSON document, headers) or, for a
streamed turn, a :class:`StreamAnswer` the adapter turns into its own stream. Admission (the
turn's ticket), enqueueing, waiting for the reply, polling, the ``Prefer`` header, the poll
``Location`` are decided here and nowhere else, and every read applies the one rule that a turn
is visible only under its own session and to its own owner
(:func:`~agentkernel.pipeline.response_store.base.visible`).

Every answer to a POST that may have enqueued its turn (200, 202, 503 after a failed or timed-out
send, 503 for a store outage or a shutdown, 504) carries the turn's ``request_id`` and a
``Location`` to poll, so the client can always find out what became of it. A request id derived
from ``Idempotency-Key`` is also the broker's dedup id: a retry with the same key never runs the
turn twice. Nothing here imports a web framework (a Lambda cold start loads none).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.blocking import call
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import MessageRejectedError, StoreError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.front.admission import admit, known_to, missing_reply
from agentkernel.pipeline.front.answers import (
    Answer,
    ChatCall,
    StreamAnswer,
    TurnAddress,
    accepted,
    record_answer,
)
from agentkernel.pipeline.front.quota import IdentityQuota
from agentkernel.pipeline.front.request_ids import RequestIds
from agentkernel.pipeline.front.sessions import SessionsAPI
from agentkernel.pipeline.front.store_errors import store_error
from agentkernel.pipeline.front.turn_control import TurnControlAPI
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.response_store.frames import read_frames
from agentkernel.pipeline.response_store.watch import ReplyWatch
from agentkernel.pipeline.runtime import tracing
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.runtime.readiness import CheckedStore, readiness
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner
from agentkernel.pipeline.session_store import SessionStore
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.turn_control.strategies import TurnOpening
from agentkernel.pipeline.webhooks.intake import WebhookCheck
from agentkernel.pipeline.wire.chat import (
    CHAT_PATH,
    ChatRequest,
    HTTPError,
    check_agent,
    parse_chat,
    poll_location,
    traceparent_or_new,
    turn_message,
    wants_async,
)
from agentkernel.pipeline.wire.envelope import (
    ATTR_TRACEPARENT,
    ATTR_USER_ID,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.wire.records import ResponseRecord

__all__ = [
    "CHAT_PATH",
    "Answer",
    "ChatCall",
    "ChatFront",
    "StreamAnswer",
    "poll_location",
    "wants_async",
]

logger = logging.getLogger(__name__)


class ChatFront:
    """The chat API over a transport and a response store, as plain data in and out.

    Args:
        transport: where turns are enqueued.
        store: where replies are read.
        config: settings; default the process-wide :class:`AKConfig`.
        registry: agents known to this process, used to reject unknown agent names early
            (an IO process without agents leaves that check to the runner, which answers 404).
        sessions: the session store the sessions API reads and erases (``None``: it answers
            501 until one is set on ``session_ops.sessions``).
    """

    def __init__(
        self,
        transport: QueueTransport,
        store: ResponseStore,
        config: AKConfig | None = None,
        registry: AgentRegistry | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        self.transport, self.store = transport, store
        self.config = config if config is not None else AKConfig.get()
        self.registry = registry if registry is not None else AgentRegistry.default()
        self._log = RateLimitedLog(logger)
        self.ids = RequestIds(self.config.api, store)
        self._waiters: dict[asyncio.Future[None], asyncio.AbstractEventLoop] = {}
        self._waiters_lock = threading.Lock()
        self._released = False
        self.quota = IdentityQuota(store, self.config.api.limits)
        self.webhooks = WebhookCheck(self.config.api.webhooks)
        control = self.config.execution.turn_control
        self.session_ops = SessionsAPI(sessions, store, self.quota, control.stale_after)
        self.turn_ops = TurnControlAPI(store, self._sessions, control, self.quota)
        #: What ``GET /ready`` checks beside the broker (an embedded runner adds its sessions).
        self.stores: dict[str, CheckedStore] = {"response_store": store}

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

    # -- chat ---------------------------------------------------------------------------------

    async def post_chat(self, chat_call: ChatCall) -> Answer | StreamAnswer:
        """Enqueue a chat turn; answer with the reply (sync), 202 (async) or a stream."""
        try:
            return await self._post_chat(chat_call)
        except HTTPError as exc:
            METRICS.inc("agentkernel_http_requests_total", status=str(exc.status))
            return Answer.of(exc)

    async def _post_chat(self, chat_call: ChatCall) -> Answer | StreamAnswer:
        chat = self.check_chat(parse_chat(self._checked_size(chat_call.body)))
        chat.stream = chat.stream or chat_call.stream
        owner = chat_call.identity
        request_id, fresh = await self.ids.request_id(
            chat.session_id, chat_call.idempotency_key, owner
        )
        turn = TurnAddress(chat.session_id, request_id)
        if not fresh:  # a retry: its ticket is checked before its reply is looked for
            await self._admit(chat, turn, owner)
        traceparent = traceparent_or_new(chat_call.traceparent)
        if chat_call.stream:
            if fresh or not await self._read(turn):
                await self._send_turn(chat, turn, traceparent, owner, admitted=not fresh)
            return StreamAnswer(request_id, chat.session_id, owner=owner)
        if wants_async(chat_call.prefer, self.config.execution.mode):
            if not fresh and (known := await self._read(turn)):
                return await self._answered(known, chat.session_id, owner)
            await self._send_turn(chat, turn, traceparent, owner, admitted=not fresh)
            return accepted(turn)
        async with self.store.watch(request_id) as watch:  # before the send: nothing slips by
            if not fresh and (known := await self._read(turn)):
                return await self._answered(known, chat.session_id, owner)
            await self._send_turn(chat, turn, traceparent, owner, admitted=not fresh)
            record = await self._wait(turn, chat_call.budget, watch)
        return await self._answered(record, chat.session_id, owner, location=turn.location)

    async def _send_turn(
        self,
        chat: ChatRequest,
        turn: TurnAddress,
        traceparent: str,
        owner: str | None,
        *,
        admitted: bool,
    ) -> None:
        """Open the turn (keeping its ticket too unless ``admitted``), then enqueue it."""
        if admitted:
            await self.turn_ops.open(chat, turn.request_id, owner)
        else:  # a fresh id: nothing can have sent it before, so no reply to look for first
            await self._admit(chat, turn, owner, named=False, open_turn=True)
        await self._enqueue(chat, turn, traceparent, owner)

    def _checked_size(self, body: bytes) -> bytes:
        limit = self.config.api.max_body_bytes
        if len(body) > limit:
            raise HTTPError(413, "BODY_TOO_LARGE", f"request body exceeds {limit} bytes")
        return body

    def check_chat(self, chat: ChatRequest) -> ChatRequest:
        """Refuse a turn this process can already tell will fail (unknown agent, shutdown).

        Raises:
            HTTPError: 404 for an unknown agent, 503 while shutting down.
        """
        check_agent(chat, self.registry)
        if ThreadRunner.shutdown_event.is_set():
            raise HTTPError(503, "SHUTTING_DOWN", "the server is shutting down; retry elsewhere")
        return chat

    async def enqueue(
        self,
        chat: ChatRequest,
        request_id: str,
        traceparent: str = "",
        *,
        identity: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> None:
        """Keep the ticket of a validated turn and put it on INPUT (the WebSocket fronts).

        Args:
            attributes: more message attributes (a Lambda WebSocket's connection and endpoint).

        Raises:
            HTTPError: 422 for a request id already used for other content, 413 when the broker
                refuses the size, 503 when it does not answer.
        """
        turn = TurnAddress(chat.session_id, request_id)
        await self._admit(chat, turn, identity, open_turn=True)
        await self._enqueue(chat, turn, traceparent_or_new(traceparent), identity, attributes)

    async def get_chat(
        self, session_id: str | None, request_id: str | None, identity: str | None = None
    ) -> Answer:
        """The reply of ``request_id`` once it is ready; 404 before, or under another session.

        Both ids are required (400 without one): a reply is only ever read under its session.
        """
        try:
            return await self._get_chat(session_id, request_id, identity)
        except HTTPError as exc:
            return Answer.of(exc)

    async def _get_chat(
        self, session_id: str | None, request_id: str | None, identity: str | None
    ) -> Answer:
        if not session_id:
            raise HTTPError(400, "INVALID_REQUEST", "the session_id query parameter is required")
        if not request_id:
            raise _no_request_id()
        turn = TurnAddress(session_id, request_id)
        record = await self._read(turn)
        if record is None or not record.visible_to(session_id, identity):
            store = self.store
            try:
                raise await call(
                    store.nonblocking, missing_reply, store, session_id, request_id, identity
                )
            except StoreError as exc:
                raise self._store_error(turn, exc) from exc
        return await self._answered(record, session_id, identity, request_id=request_id)

    async def resume_stream(
        self, session_id: str, request_id: str, identity: str | None, after: int
    ) -> Answer | StreamAnswer:
        """Resume a streamed turn: the chunks after ``after``, then live ones.

        Answers 404 before the first byte of a stream unless ``identity`` may see the turn
        under ``session_id`` (its ticket or its reply says so).
        """
        if not request_id:
            return Answer.of(_no_request_id())
        turn, store = TurnAddress(session_id, request_id), self.store
        try:
            known = await call(store.nonblocking, known_to, store, session_id, request_id, identity)
        except StoreError as exc:
            return Answer.of(self._store_error(turn, exc))
        if not known:
            doc = {"error": "NOT_FOUND", "message": "no such turn in this session", **turn.ids}
            return Answer(404, doc)
        return StreamAnswer(request_id, session_id, after, identity)

    async def socket_request_id(self, client_id: str | None, identity: str | None) -> str:
        """The request id of a WebSocket turn the client named ``client_id``: derived from the
        identity and ``client_id`` only (one id per identity, whatever the session; no chat
        session id is empty, so it never equals an HTTP key's id), so one identity's ids never
        collide with another's. Raises ``HTTPError`` 503 without the deployment's secret."""
        request_id, _ = await self.ids.request_id("", client_id, identity)
        return request_id

    def frames(self, stream: StreamAnswer) -> AsyncIterator[dict[str, Any] | None]:
        """The frames of a streamed turn (``None``: time for a keep-alive)."""
        api = self.config.api
        frames = read_frames(
            self.store,
            stream.request_id,
            stream.session_id,
            after=stream.after,
            heartbeat=api.stream_heartbeat,
            idle_timeout=api.sync_timeout,
            owner=stream.owner,
        )
        return self.quota.reading(frames, stream.owner, stream.request_id)

    async def cancel(
        self, session_id: str | None, request_id: str | None, identity: str | None = None
    ) -> Answer:
        """Cancel a queued or running turn (see :mod:`agentkernel.pipeline.front.turn_control`)."""
        return await self.turn_ops.cancel(session_id, request_id, identity)

    async def wait_reply(self, request_id: str) -> ResponseRecord | None:
        """Wait for a reply up to ``api.sync_timeout`` seconds (the WebSocket front)."""
        return await self.store.wait(request_id, self.config.api.sync_timeout)

    # -- sessions (pipeline.sessions) ---------------------------------------------------------

    async def list_sessions(
        self, identity: str | None, limit: str | None, cursor: str | None
    ) -> Answer:
        """The caller's sessions, newest activity first (see :class:`SessionsAPI`)."""
        return await self.session_ops.list(identity, limit, cursor)

    async def show_session(self, session_id: str, identity: str | None) -> Answer:
        """One of the caller's sessions: state, recent turns, last reply; 404 if not theirs."""
        return await self.session_ops.show(session_id, identity)

    async def delete_session(self, session_id: str, identity: str | None) -> Answer:
        """Erase one of the caller's sessions everywhere; 204 whether or not it existed."""
        return await self.session_ops.delete(session_id, identity)

    def _sessions(self) -> SessionStore | None:
        return self.session_ops.sessions

    # -- service routes -------------------------------------------------------------------------

    def agents(self) -> Answer:
        """The agents registered in this process: ``agents`` lists their names (the shape
        upstream clients read), ``details`` describes each one."""
        agents = self.registry.agents()
        details = [
            {"name": a.name, "description": a.description, "streaming": a.streaming} for a in agents
        ]
        return Answer(200, {"agents": [a.name for a in agents], "details": details})

    async def ready(self) -> Answer:
        """Readiness: the broker and the stores answer, take writes and still hold their data."""
        checks = {"queue": self.transport.ping} | {n: s.ping for n, s in self.stores.items()}
        warnings = [f"{n}: {w}" for n, s in self.stores.items() for w in s.warnings()]
        return Answer(*await readiness(checks, warnings))

    # -- the steps of a turn ------------------------------------------------------------------

    async def _admit(
        self,
        chat: ChatRequest,
        turn: TurnAddress,
        owner: str | None,
        named: bool = True,
        *,
        open_turn: bool = False,
    ) -> None:
        """Keep the turn's ticket; 422 when its idempotency key was used for other content
        (``named=False``: a random request id, which nothing can reuse). ``open_turn``: then
        open it under its session (:meth:`TurnControlAPI.open`) in the same thread hop."""
        await self.webhooks.check(chat)  # 400 for a webhook this deployment will not call
        opening = self.turn_ops.opening(chat, turn.request_id, owner) if open_turn else None
        inline = self.store.nonblocking and (opening is None or opening.nonblocking)
        try:
            await call(inline, self._admission, chat, turn, owner, named, opening)
        except StoreError as exc:  # full, or lost its data: the turn could not be answered
            raise self._store_error(turn, exc) from exc
        if open_turn:
            await self.turn_ops.opened(chat, turn.request_id, owner, opening)

    def _admission(
        self,
        chat: ChatRequest,
        turn: TurnAddress,
        owner: str | None,
        named: bool,
        opening: TurnOpening | None,
    ) -> None:
        """The quota's count, the ticket, then the opening (which keeps its own errors for
        :meth:`TurnControlAPI.opened`): blocking, one thread hop for all."""
        if self.quota.counts(owner):
            self.quota.admit(owner, turn.request_id, chat.session_id)
        admit(self.store, chat, turn.request_id, owner, named)
        if opening is not None:
            opening.run()

    async def _read(self, turn: TurnAddress) -> ResponseRecord | None:
        """The stored reply of ``turn``; a store failure becomes an answer saying where to poll."""
        try:
            return await asyncio.to_thread(self.store.get, turn.request_id)
        except StoreError as exc:
            raise self._store_error(turn, exc) from exc

    async def _wait(
        self, turn: TurnAddress, limit: float | None, watch: ReplyWatch
    ) -> ResponseRecord:
        """Wait for the reply: 504 after the budget, 503 when this process shuts down."""
        loop = asyncio.get_running_loop()
        released: asyncio.Future[None] = loop.create_future()
        with self._waiters_lock:
            self._waiters[released] = loop
            if self._released:
                released.set_result(None)
        budget = self.config.execution.response_store.sync_wait(
            self.config.api.sync_timeout, self.store.pushes
        )
        if limit is not None:
            budget = max(min(budget, limit), 0.0)
        try:
            record = await watch.result(budget, released)
        except StoreError as exc:
            raise self._store_error(turn, exc) from exc
        finally:
            with self._waiters_lock:
                self._waiters.pop(released, None)
        if record is not None:
            return record
        if not released.done():
            raise turn.error(504, "TIMEOUT", "no reply within the wait budget; poll for it later")
        raise turn.error(
            503,
            "SHUTTING_DOWN",
            "the server is shutting down; the turn is queued, poll the Location for its reply",
        )

    async def _answered(self, record: ResponseRecord, *args: Any, **kwargs: Any) -> Answer:
        """The answer for a reply shown to its caller, which then counts as read."""
        answer = record_answer(record, *args, **kwargs)  # refuses one the caller may not see
        if self.quota.counts(record.owner):  # no thread hop for a turn nobody counts
            await call(self.store.nonblocking, self.quota.read, record)
        return answer

    def _store_error(self, turn: TurnAddress, exc: StoreError) -> HTTPError:
        self._log.log(
            logging.WARNING,
            f"store:{type(exc).__name__}",
            "response store failed for request %s: %s",
            turn.request_id,
            exc,
        )
        return store_error(turn, exc)

    async def _enqueue(
        self,
        chat: ChatRequest,
        turn: TurnAddress,
        traceparent: str,
        owner: str | None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """Put the turn on INPUT, its request id doubling as the broker's dedup id.

        A failed or timed-out send may still have reached the broker, so the 503 carries the
        request id and a Location: polling it, or retrying with the same Idempotency-Key,
        resolves what happened without running the turn twice.
        """
        attributes = dict(extra or {})
        if owner is not None:
            attributes[ATTR_USER_ID] = owner
        try:
            with _enqueue_span(turn, traceparent) as context:
                attributes[ATTR_TRACEPARENT] = context or traceparent
                await self._send(turn_message(chat, turn.request_id, attributes))
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

    async def _send(self, message: QueueMessage) -> None:
        if self.transport.nonblocking:  # returns at once: no task, no timer
            self.transport.send(QueueName.INPUT, message)
        else:
            async with asyncio.timeout(self.config.api.enqueue_timeout):  # no task, unlike wait_for
                await self.transport.send_async(QueueName.INPUT, message)


def _enqueue_span(
    turn: TurnAddress, traceparent: str
) -> contextlib.AbstractContextManager[str | None]:
    """The turn's ``enqueue`` span; nothing (not even its attributes) while tracing is off."""
    if not tracing.recording():
        return contextlib.nullcontext(traceparent)
    about = {"agentkernel.request_id": turn.request_id, "agentkernel.session_id": turn.session_id}
    return tracing.span("enqueue", traceparent, "PRODUCER", about, in_span=True)


def _no_request_id() -> HTTPError:
    return HTTPError(400, "INVALID_REQUEST", "the request_id query parameter is required")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
