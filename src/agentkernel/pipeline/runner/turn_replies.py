"""How a turn's outcome reaches its caller: committed with its session, then replied.

The Agent Runner decides each turn's outcome; :class:`TurnReplies` makes it take effect once.
It commits the outcome together with the session's new state, fenced by the version the turn
read, closes the turn in its session, and only then sends the reply to OUTPUT (or hands it to
the response handler when both run on one event loop). A delivery of a turn already committed
gets its committed reply again; a commit lost to another turn raises, so the turn runs again on
the newer state. Replies that commit nothing (a malformed turn, an unknown agent, a store that
lost data) go out the same way.

Each outcome is in the table of docs/architecture.md, "A turn's effects happen once".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from agentkernel.core.agent import Turn
from agentkernel.core.blocking import call
from agentkernel.core.errors import (
    MessageRejectedError,
    SessionStateError,
    StaleSessionError,
    StoreDataLostError,
)
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.front.store_errors import DATA_LOST
from agentkernel.pipeline.runner.last_errors import cause_of
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.session_store import SessionRecord, SessionStore, TurnOutcome
from agentkernel.pipeline.transport.blocking import AnyTransport, adapt
from agentkernel.pipeline.turn_control.signals import TurnSignals, close_quietly
from agentkernel.pipeline.wire.envelope import ATTR_STREAM, ATTR_USER_ID, QueueMessage, QueueName
from agentkernel.pipeline.wire.replies import error_doc, reply_message
from agentkernel.pipeline.wire.scoping import session_key

# The runner's logger: these records are the runner's, and operators filter them by that name.
logger = logging.getLogger("agentkernel.pipeline.runner.agent_runner")


class TurnReplies:
    """Commits turns' outcomes and sends their replies, for one Agent Runner.

    Args:
        transport: carries OUTPUT.
        sessions: where outcomes are committed.
        signals: the sessions' turn signals (a turn is closed once its outcome is decided);
            ``None`` without turn control.
        stream_all: mark every reply as streamed (the stream runner).
    """

    #: Offered each reply before it is sent to OUTPUT: handles it in place and returns ``True``,
    #: or ``False`` to have it sent (the embedded topology's OUTPUT consumer, see
    #: :meth:`~agentkernel.pipeline.consumer.in_loop.InLoopConsumer.hand_over`).
    hand_over: Callable[[QueueMessage], bool] | None = None

    def __init__(
        self,
        transport: AnyTransport,
        sessions: SessionStore,
        signals: TurnSignals | None,
        *,
        stream_all: bool = False,
    ) -> None:
        self.transport, self.sessions, self.signals = adapt(transport), sessions, signals
        self._stream_all = stream_all
        self._log = RateLimitedLog(logger)
        #: Session calls that also reach the signals (commit + close) run inline only when
        #: neither can block.
        self.inline = sessions.nonblocking and (signals is None or signals.nonblocking)

    def close(self, message: QueueMessage, request_id: str) -> None:
        """The turn's outcome is decided: it no longer counts as open in its session (blocking;
        best effort)."""
        signals, key = self.signals, message.group_id
        if signals is not None and key is not None:
            close_quietly(signals, key, request_id)

    async def read(self, key: str) -> SessionRecord:
        return await call(self.sessions.nonblocking, self.sessions.read, key)

    async def commit_and_reply(
        self,
        message: QueueMessage,
        session_id: str,
        base: SessionRecord,
        outcome: TurnOutcome,
        state: dict[str, Any] | None,
    ) -> None:
        """Commit the turn's outcome and state at ``base``'s version, then send the reply.

        Losing the commit to another attempt of the same turn re-sends that attempt's reply;
        losing it to a different turn raises, so the turn runs again on the newer state.
        """
        key, position = key_of(message, session_id), message.position
        try:
            await call(self.inline, self._commit, message, key, base, outcome, state)
        except StaleSessionError:
            fresh = await self.read(key)
            if fresh.version == 0 and base.version > 0:  # erased while the turn ran
                await self._erased(message, session_id, outcome.request_id)
                return
            if not fresh.has_applied(outcome.request_id, position):
                raise
            logger.warning(
                "turn %s of session %s was committed by another attempt; keeping that one",
                outcome.request_id,
                session_id,
            )
            await self.replay(message, session_id, fresh, outcome.request_id)
            return
        try:
            await self._send(message, session_id, outcome, close=False)
        except MessageRejectedError as exc:
            record = base.advance(outcome, state, position)
            await self._reject_reply(message, session_id, record, exc, base)

    def _commit(
        self,
        message: QueueMessage,
        key: str,
        base: SessionRecord,
        outcome: TurnOutcome,
        state: dict[str, Any] | None,
    ) -> None:
        """Commit the turn's outcome, then close the turn: one thread hop for both (blocking).

        The turn closes before its reply is sent: its outcome is decided by the commit, and
        the caller who reads the reply finds its session no longer busy with it.
        """
        if self.signals is not None and message.group_id == key:  # the usual case
            self.sessions.commit_turn(key, base, outcome, state, message.position)
            return
        self.sessions.commit(key, base, outcome, state, message.position)
        self.close(message, outcome.request_id)

    async def replay(
        self, message: QueueMessage, session_id: str, record: SessionRecord, request_id: str
    ) -> None:
        """Answer a delivery of a turn that is already committed, without running it again."""
        METRICS.inc("agentkernel_turns_replayed_total")
        outcome = record.outcome(request_id)
        if outcome is None:
            # Later turns of the session were committed after it, and a session's next turn
            # only starts once the previous one was acknowledged, after its reply was sent.
            # Sending anything now would overwrite that reply in the response store.
            logger.info(
                "turn %s of session %s (at %s) was applied and answered before; not running it",
                request_id,
                session_id,
                message.position or message.message_id,
            )
            return
        logger.info(
            "turn %s of session %s is committed; re-sending its reply", request_id, session_id
        )
        try:
            await self._send(message, session_id, outcome)
        except MessageRejectedError as exc:
            await self._reject_reply(message, session_id, record, exc, None)

    async def _reject_reply(
        self,
        message: QueueMessage,
        session_id: str,
        record: SessionRecord,
        exc: MessageRejectedError,
        before: SessionRecord | None,
    ) -> None:
        """A committed reply the broker can never carry: commit and send an error instead.

        The turn's state is rolled back to ``before`` the turn when it is known (the client
        never saw the reply, so the conversation should not contain it).
        """
        request_id = record.last.request_id if record.last else ""
        logger.error(
            "reply of turn %s of session %s cannot be sent (%s); answering REPLY_TOO_LARGE",
            request_id,
            session_id,
            exc,
        )
        doc = error_doc("REPLY_TOO_LARGE", str(exc), session_id, request_id)
        outcome = TurnOutcome(request_id, 500, json.dumps(doc))
        state = None if before is None else before.state
        key = key_of(message, session_id)
        await call(self.inline, self._commit, message, key, record, outcome, state)
        await self._send(message, session_id, outcome, close=False)

    async def state_not_stored(
        self, message: QueueMessage, turn: Turn, base: SessionRecord, exc: SessionStateError
    ) -> dict[str, Any]:
        """The state the agent left cannot be stored: commit and send an error at once, keeping
        the state from before the turn (a retry would run the agent again to the same end)."""
        logger.error(
            "turn %s of session %s: agent %s left a state that cannot be stored: %s",
            turn.request_id,
            turn.session_id,
            turn.agent,
            exc,
        )
        text = f"agent '{turn.agent}' left a session state that cannot be stored: {cause_of(exc)}"
        doc = error_doc("STATE_NOT_STORED", text, turn.session_id, turn.request_id)
        outcome = TurnOutcome(turn.request_id, 500, json.dumps(doc))
        await self.commit_and_reply(message, turn.session_id, base, outcome, None)
        return doc

    async def _erased(self, message: QueueMessage, session_id: str, request_id: str) -> None:
        """The session was erased while its turn ran: answer so, writing nothing back."""
        logger.info(
            "turn %s of session %s: the session was erased meanwhile", request_id, session_id
        )
        text = "the session was deleted (or expired) while this turn ran; nothing was kept"
        await self.reply(message, 409, error_doc("SESSION_DELETED", text, session_id, request_id))

    async def refuse(
        self, message: QueueMessage, session_id: str, request_id: str, exc: StoreDataLostError
    ) -> None:
        """The store lost data the turn needs: answer so, without running or committing it."""
        key = "data-lost"
        self._log.log(logging.ERROR, key, "turn %s refused: %s", request_id, exc)
        doc = error_doc("STORE_DATA_LOST", DATA_LOST, session_id, request_id)
        await self.reply(message, 503, doc)

    async def reply(self, message: QueueMessage, status: int, doc: dict[str, Any]) -> None:
        """Send a reply that commits nothing (the agent did not run)."""
        outcome = TurnOutcome(doc["request_id"], status, json.dumps(doc))
        await self._send(message, doc.get("session_id") or "", outcome)

    async def _send(
        self, message: QueueMessage, session_id: str, outcome: TurnOutcome, *, close: bool = True
    ) -> None:
        """Put the reply on OUTPUT; ``close``: then close the turn (not closed by a commit)."""
        reply = reply_message(
            message, session_id, outcome.request_id, outcome.status_code, outcome.body
        )
        if self._stream_all:
            reply.attributes[ATTR_STREAM] = "1"
        transport, closing = self.transport, self.signals if close else None
        # Handed over, the reply is stored at once: only where the close that follows cannot
        # yield, so that its caller never reads it while its turn still counts as open.
        can_hand_over = closing is None or closing.nonblocking
        if self.hand_over is not None and can_hand_over and self.hand_over(reply):
            if closing is not None:
                self.close(message, outcome.request_id)
            return
        await transport.send(QueueName.OUTPUT, reply)
        if closing is not None:
            await call(closing.nonblocking, self.close, message, outcome.request_id)


def key_of(message: QueueMessage, session_id: str) -> str:
    """The session store key of the turn's session: scoped by the identity that sent it."""
    return session_key(session_id, message.attributes.get(ATTR_USER_ID))
