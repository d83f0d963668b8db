"""Turn control as the chat front uses it: open each turn under its session's strategy, and
cancel a turn (``POST /api/v1/chat/{session_id}/cancel?request_id=``, the WebSocket ``cancel``
frame, the Lambda front).

A cancel is owner-checked like every read (a turn another identity sent, or of another
session, is ``404 NOT_FOUND``) and idempotent. It answers:

- ``200`` with the turn's final ``CANCELLED`` (or ``SUPERSEDED``) reply once the runner has
  stopped it, within ``execution.turn_control.cancel_wait`` seconds;
- ``202`` ``CANCEL_REQUESTED`` when the turn has not answered yet within that wait (it is queued
  behind a long turn, or no runner is up): its callers get ``CANCELLED`` when it is reached;
- ``409`` ``ALREADY_FINISHED`` for a turn that had answered otherwise before the cancel took.

The runner is the only one that decides a turn's outcome (it commits it), so a cancel never
answers "cancelled" for a turn whose effects were committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agentkernel.core.blocking import call
from agentkernel.core.config.turns import MultitaskStrategy, TurnControlConfig
from agentkernel.core.errors import StoreError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.front.admission import known_to
from agentkernel.pipeline.front.answers import Answer, TurnAddress
from agentkernel.pipeline.front.quota import IdentityQuota
from agentkernel.pipeline.front.store_errors import store_error
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.session_store.base import SessionStore
from agentkernel.pipeline.turn_control.outcomes import STOPPED_CODES
from agentkernel.pipeline.turn_control.signals import Stop, StopKind, TurnSignals
from agentkernel.pipeline.turn_control.strategies import TurnOpening
from agentkernel.pipeline.wire.chat import ChatRequest, HTTPError
from agentkernel.pipeline.wire.records import ResponseRecord
from agentkernel.pipeline.wire.scoping import session_key

__all__ = ["TurnControlAPI", "cancel_frame"]

logger = logging.getLogger(__name__)


class TurnControlAPI:
    """Strategies and cancellation over the turn signals of the session store.

    Args:
        store: the response store (tickets say who owns a turn; replies say how it ended).
        sessions: returns the session store whose signals are used (``None``: this process
            cannot reach the sessions; only ``enqueue`` works and a cancel answers 501).
        config: ``execution.turn_control``.
        quota: the callers' quota counts (a rejected turn's reply counts as read).
    """

    def __init__(
        self,
        store: ResponseStore,
        sessions: Callable[[], SessionStore | None],
        config: TurnControlConfig,
        quota: IdentityQuota,
    ) -> None:
        self.store, self.config, self.quota = store, config, quota
        self._sessions = sessions
        self._log = RateLimitedLog(logger)

    def signals(self) -> TurnSignals | None:
        """The signals of this process's session store, if it keeps any."""
        sessions = self._sessions()
        return None if sessions is None else sessions.turn_signals(self.config.stale_after)

    # -- opening a turn ----------------------------------------------------------------------

    async def open(self, chat: ChatRequest, request_id: str, owner: str | None) -> None:
        """Open the turn under its session and apply its multitask strategy, before it is
        enqueued.

        A turn refused here (``reject``, or a strategy this process cannot apply) gets its
        refusal as its stored reply too: a poll of it then says so rather than ``PENDING``.

        Raises:
            HTTPError: 409 ``SESSION_BUSY`` (reject), 501 when a strategy other than
                ``enqueue`` is asked and this process cannot reach the session store, 503 when
                the store fails for such a strategy.
        """
        opening = self.opening(chat, request_id, owner)
        if opening is not None:
            await call(opening.nonblocking, opening.run)
        await self.opened(chat, request_id, owner, opening)

    def opening(self, chat: ChatRequest, request_id: str, owner: str | None) -> TurnOpening | None:
        """The blocking half of :meth:`open`, for a caller that runs it beside other blocking
        work (``None``: this process keeps no signals); pass it to :meth:`opened` once run."""
        signals = self.signals()
        if signals is None:
            return None
        strategy = chat.multitask_strategy or self.config.multitask_strategy
        return TurnOpening(signals, session_key(chat.session_id, owner), request_id, strategy)

    async def opened(
        self, chat: ChatRequest, request_id: str, owner: str | None, opening: TurnOpening | None
    ) -> None:
        """The end of :meth:`open` once ``opening`` ran (raises as :meth:`open` does)."""
        strategy = chat.multitask_strategy or self.config.multitask_strategy
        turn = TurnAddress(chat.session_id, request_id)
        if opening is None:
            if strategy is not MultitaskStrategy.ENQUEUE:
                refusal = _unsupported(turn)
                await self._keep_refusal(turn, refusal, owner)
                raise refusal
            return
        try:
            stopped = opening.result()
        except HTTPError as exc:  # reject: the session is busy
            exc.doc["session_id"] = chat.session_id
            await self._keep_refusal(turn, exc, owner)
            raise
        except StoreError as exc:
            if strategy is MultitaskStrategy.ENQUEUE:  # nothing depends on it: go on
                self._log.log(
                    logging.WARNING,
                    f"open:{type(exc).__name__}",
                    "turn %s not marked open in its session (it goes on): %s",
                    request_id,
                    exc,
                )
                return
            raise store_error(turn, exc) from exc
        for other in stopped:
            METRICS.inc("agentkernel_turn_stops_total", reason=strategy.value)
            logger.info("turn %s asks turn %s to stop (%s)", request_id, other, strategy.value)

    async def _keep_refusal(self, turn: TurnAddress, exc: HTTPError, owner: str | None) -> None:
        record = ResponseRecord(turn.request_id, turn.session_id, exc.status, exc.doc, owner)
        try:
            await call(self.store.nonblocking, self.store.put, record)
            if self.quota.counts(owner):  # answered at once: nothing is left unread
                await call(self.store.nonblocking, self.quota.read, record)
        except StoreError as exc_store:  # the caller still gets its 409
            self._log.log(
                logging.WARNING,
                f"refusal:{type(exc_store).__name__}",
                "refusal of turn %s not stored: %s",
                turn.request_id,
                exc_store,
            )

    # -- cancelling a turn -------------------------------------------------------------------

    async def _wait(self, request_id: str) -> ResponseRecord | None:
        return await _wait_final(self.store, request_id, self.config.cancel_wait)

    async def cancel(
        self, session_id: str | None, request_id: str | None, identity: str | None
    ) -> Answer:
        """Cancel turn ``request_id`` of ``session_id`` (see the module docstring)."""
        try:
            return await self._cancel(session_id, request_id, identity)
        except HTTPError as exc:
            return Answer.of(exc)

    async def _cancel(
        self, session_id: str | None, request_id: str | None, identity: str | None
    ) -> Answer:
        if not session_id or not request_id:
            raise HTTPError(
                400, "INVALID_REQUEST", "both the session id and request_id are required"
            )
        turn, store = TurnAddress(session_id, request_id), self.store
        try:
            if not await call(store.nonblocking, known_to, store, session_id, request_id, identity):
                raise HTTPError(404, "NOT_FOUND", "no such turn in this session", None, **turn.ids)
            if (record := await call(store.nonblocking, store.get, request_id)) is not None:
                return _ended(turn, record)
            signals = self.signals()
            if signals is None:
                raise _unsupported(turn)
            key, stop = session_key(session_id, identity), Stop(StopKind.CANCEL)
            await call(signals.nonblocking, signals.stop, key, request_id, stop)
            METRICS.inc("agentkernel_turn_stops_total", reason="cancel")
            record = await self._wait(request_id)
        except StoreError as exc:
            raise store_error(turn, exc) from exc
        if record is not None:
            return _ended(turn, record)
        doc = {
            "status": "CANCEL_REQUESTED",
            "message": "the turn has not answered yet; its callers get CANCELLED once a runner "
            "reaches it",
            **turn.ids,
        }
        return Answer(202, doc, {"Location": turn.location})


async def _wait_final(
    store: ResponseStore, request_id: str, timeout: float
) -> ResponseRecord | None:
    """The turn's final reply within ``timeout`` seconds (a store may wake its waiters on each
    stream chunk too, so one wait is not enough)."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        if (record := await store.wait(request_id, remaining)) is not None:
            return record
    return None


def cancel_frame(answer: Answer, shown: str, session_id: str) -> dict[str, Any]:
    """The WebSocket frame answering a cancel frame: ``CANCEL_RESPONSE`` with the cancel's
    status code and document, under the client's own name for the turn (``shown``)."""
    frame = {"type": "CANCEL_RESPONSE", "status_code": answer.status, "session_id": session_id}
    return (
        frame
        | {k: v for k, v in (answer.doc or {}).items() if k not in frame}
        | {"request_id": shown}
    )


def _ended(turn: TurnAddress, record: ResponseRecord) -> Answer:
    """The answer to a cancel of a turn that has its final reply."""
    if record.body.get("error") in STOPPED_CODES:
        doc: dict[str, Any] = {"status": record.body["error"], **turn.ids, "reply": record.body}
        return Answer(200, doc)
    raise HTTPError(
        409,
        "ALREADY_FINISHED",
        "the turn had already answered; read its reply",
        {"Location": turn.location},
        status_code=record.status_code,
        **turn.ids,
    )


def _unsupported(turn: TurnAddress) -> HTTPError:
    return HTTPError(
        501,
        "TURN_CONTROL_UNAVAILABLE",
        "this process cannot reach the session store (session.type in_memory lives in the "
        "runner process): configure a shared one (redis, dynamodb, postgres) to cancel turns "
        "or use a multitask strategy other than enqueue",
        None,
        **turn.ids,
    )
