"""The read side of the chat front: replies read, waited for, resumed and streamed.

:class:`ChatReads` is the half of :class:`~agentkernel.pipeline.front.chat_front.ChatFront` that
never enqueues: ``GET /chat``, a resumed stream, the frames of a streamed turn, the WebSocket's
wait, and the ``rest_sync`` wait with the waiters a shutting-down process releases at once. Every
read applies the one rule that a turn is visible only under its own session and to its own owner.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from agentkernel.core.blocking import call
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import StoreError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.front.admission import known_to, missing_reply
from agentkernel.pipeline.front.answers import Answer, StreamAnswer, TurnAddress, record_answer
from agentkernel.pipeline.front.quota import IdentityQuota
from agentkernel.pipeline.front.store_errors import store_error
from agentkernel.pipeline.response_store import ResponseRecord, ResponseStore
from agentkernel.pipeline.response_store.frames import read_frames
from agentkernel.pipeline.response_store.watch import ReplyWatch
from agentkernel.pipeline.wire.chat import HTTPError

__all__ = ["ChatReads"]


class ChatReads:
    """Reading, waiting for and streaming replies; a mixin of the chat front.

    The front sets ``store``, ``config``, ``quota`` and ``_log`` before its first read; this
    class owns the ``rest_sync`` waiters (``__init__`` starts with none).
    """

    store: ResponseStore
    config: AKConfig
    quota: IdentityQuota
    _log: RateLimitedLog

    def __init__(self) -> None:
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

    # -- reads ----------------------------------------------------------------------------------

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

    async def wait_reply(self, request_id: str) -> ResponseRecord | None:
        """Wait for a reply up to ``api.sync_timeout`` seconds (the WebSocket front)."""
        return await self.store.wait(request_id, self.config.api.sync_timeout)

    # -- the steps of a read --------------------------------------------------------------------

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


def _no_request_id() -> HTTPError:
    return HTTPError(400, "INVALID_REQUEST", "the request_id query parameter is required")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
