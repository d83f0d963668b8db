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
from collections.abc import Mapping

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.blocking import call
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import MessageRejectedError, StoreError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.front.admission import admit
from agentkernel.pipeline.front.answers import (
    Answer,
    ChatCall,
    StreamAnswer,
    TurnAddress,
    accepted,
)
from agentkernel.pipeline.front.quota import IdentityQuota
from agentkernel.pipeline.front.reads import ChatReads
from agentkernel.pipeline.front.request_ids import RequestIds
from agentkernel.pipeline.front.sessions import SessionsAPI
from agentkernel.pipeline.front.turn_control import TurnControlAPI
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.runtime import tracing
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.runtime.readiness import CheckedStore, readiness
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner
from agentkernel.pipeline.session_store import SessionStore
from agentkernel.pipeline.transport.blocking import AnyTransport, adapt
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


class ChatFront(ChatReads):
    """The chat API over a transport and a response store, as plain data in and out.

    The read side (``get_chat``, ``resume_stream``, ``frames``, ``wait_reply``, the ``rest_sync``
    waiters) comes from :class:`~agentkernel.pipeline.front.reads.ChatReads`.

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
        transport: AnyTransport,
        store: ResponseStore,
        config: AKConfig | None = None,
        registry: AgentRegistry | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        super().__init__()
        self.transport, self.store = adapt(transport), store
        self.config = config if config is not None else AKConfig.get()
        self.registry = registry if registry is not None else AgentRegistry.default()
        self._log = RateLimitedLog(logger)
        self.ids = RequestIds(self.config.api, store)
        self.quota = IdentityQuota(store, self.config.api.limits)
        self.webhooks = WebhookCheck(self.config.api.webhooks)
        control = self.config.execution.turn_control
        self.session_ops = SessionsAPI(sessions, store, self.quota, control.stale_after)
        self.turn_ops = TurnControlAPI(store, self._sessions, control, self.quota)
        #: What ``GET /ready`` checks beside the broker (an embedded runner adds its sessions).
        self.stores: dict[str, CheckedStore] = {"response_store": store}

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

    async def socket_request_id(self, client_id: str | None, identity: str | None) -> str:
        """The request id of a WebSocket turn the client named ``client_id``: derived from the
        identity and ``client_id`` only (one id per identity, whatever the session; no chat
        session id is empty, so it never equals an HTTP key's id), so one identity's ids never
        collide with another's. Raises ``HTTPError`` 503 without the deployment's secret."""
        request_id, _ = await self.ids.request_id("", client_id, identity)
        return request_id

    async def cancel(
        self, session_id: str | None, request_id: str | None, identity: str | None = None
    ) -> Answer:
        """Cancel a queued or running turn (see :mod:`agentkernel.pipeline.front.turn_control`)."""
        return await self.turn_ops.cancel(session_id, request_id, identity)

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
        if self.transport.queues_in_process:  # no broker to wait for: no timer
            await self.transport.send(QueueName.INPUT, message)
        else:
            async with asyncio.timeout(self.config.api.enqueue_timeout):  # no task, unlike wait_for
                await self.transport.send(QueueName.INPUT, message)


def _enqueue_span(
    turn: TurnAddress, traceparent: str
) -> contextlib.AbstractContextManager[str | None]:
    """The turn's ``enqueue`` span; nothing (not even its attributes) while tracing is off."""
    if not tracing.recording():
        return contextlib.nullcontext(traceparent)
    about = {"agentkernel.request_id": turn.request_id, "agentkernel.session_id": turn.session_id}
    return tracing.span("enqueue", traceparent, "PRODUCER", about, in_span=True)
