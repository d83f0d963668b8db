"""The Agent Runner: INPUT queue -> agent turn -> OUTPUT queue.

Turns run as asyncio tasks, so one process keeps up to ``execution.runner.max_in_flight`` turns
going whatever its number of consumer threads; a session's next turn is only fetched once the
previous one was acknowledged.

A turn's effects happen once: the runner reads the session record, runs the agent, then commits
the new state together with the reply (keyed by ``request_id``, fenced by the session version),
and only then sends the reply and acknowledges the message. A delivery of a turn that is already
committed is not run again: its committed reply is sent again (the commit and the replies are
:mod:`agentkernel.pipeline.runner.turn_replies`). Delivery stays at-least-once, so
an agent's own side effects (a payment, an e-mail) should use ``turn.request_id`` as their
idempotency key.

Each outcome of a turn (its reply, and whether it is committed) is in the table of
docs/architecture.md, "A turn's effects happen once".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
from contextlib import AbstractAsyncContextManager
from typing import ClassVar

from pydantic import ValidationError

from agentkernel.core.agent import AgentRegistry, Turn
from agentkernel.core.blocking import call
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import (
    AgentNotFoundError,
    SessionStateError,
    StoreDataLostError,
)
from agentkernel.pipeline.consumer.base import QueueConsumer
from agentkernel.pipeline.consumer.handling import HandlingPolicy, MessageHandling
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.consumer.settings import LoopSettings
from agentkernel.pipeline.runner.execution import Streamer, execute, turn_of
from agentkernel.pipeline.runner.last_attempt import LastAttempt
from agentkernel.pipeline.runner.last_errors import LastErrors
from agentkernel.pipeline.runner.turn_log import turn_finished
from agentkernel.pipeline.runner.turn_replies import TurnReplies, key_of
from agentkernel.pipeline.runtime import tracing
from agentkernel.pipeline.runtime.collector import tune_for_server
from agentkernel.pipeline.runtime.health_server import HealthServer
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner
from agentkernel.pipeline.session_store import (
    SessionRecord,
    SessionStore,
    TurnOutcome,
    create_session_store,
)
from agentkernel.pipeline.session_store.adoption import UnscopedAdoption
from agentkernel.pipeline.transport.blocking import AnyTransport, adapt
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.turn_control.outcomes import stopped_doc
from agentkernel.pipeline.turn_control.signals import Stop
from agentkernel.pipeline.turn_control.watcher import StopWatcher
from agentkernel.pipeline.wire.envelope import (
    ATTR_REQUEST_ID,
    ATTR_STREAM,
    ATTR_USER_ID,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.wire.position import Position
from agentkernel.pipeline.wire.replies import (
    ChatTurnBody,
    error_doc,
    first_error,
    session_mismatch,
    session_of,
    turn_failed_doc,
)

logger = logging.getLogger(__name__)


class AgentRunner(QueueConsumer):
    """Consumes INPUT, runs agent turns, sends replies to OUTPUT.

    Args:
        config: settings (``execution.queues``, ``execution.runner``, ``session``).
        registry: the agents this process runs.
        transport: carries both queues; default the configured one.
        sessions: per-session state; default the configured store.
    """

    #: Stream every turn's reply as chunks, whatever the request asked (the stream runner).
    stream_all: ClassVar[bool] = False

    def __init__(
        self,
        config: AKConfig,
        registry: AgentRegistry,
        *,
        transport: AnyTransport | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        execution = config.execution
        if transport is None:
            transport = QueueTransportFactory.create(execution.queues)
        self.transport, self.registry = adapt(transport), registry
        self._owns_sessions = sessions is None  # made here: closed by serve()
        self.sessions = sessions if sessions is not None else create_session_store(config.session)
        self.adoption = UnscopedAdoption(self.sessions, config.session.adopt_unscoped)
        self.queues, self.runner = execution.queues, execution.runner
        self.last_attempt = LastAttempt(
            self.runner.isolate_last_attempt, self.queues.input.max_receive_count
        )
        self._last_errors = LastErrors()
        control = execution.turn_control
        self.signals = self.sessions.turn_signals(control.stale_after)
        self.watcher = (
            None if self.signals is None else StopWatcher(self.signals, control.poll_interval)
        )
        #: Commits each turn's outcome and sends its reply.
        self.replies = TurnReplies(
            self.transport, self.sessions, self.signals, stream_all=self.stream_all
        )

    # -- entry points ----------------------------------------------------------------------

    @classmethod
    def run(cls) -> None:
        """Process entry: build from the process's configuration and agents, consume until SIGTERM.

        The CLI sets both (:meth:`AKConfig.set`, the registry the agents registered in).
        """
        runner = cls(AKConfig.get(), AgentRegistry.default())
        ThreadRunner.install_signal_handlers()
        tune_for_server()  # the process is the runner's
        runner.serve()

    def serve(self) -> None:
        """Consume INPUT until shutdown (blocks), then close the transport.

        With ``execution.runner.health_port`` set, ``/health``, ``/ready`` and ``/metrics`` are
        served on it meanwhile (:mod:`agentkernel.pipeline.runtime.health_server`).
        """
        tracing.export_if_configured()
        probe = self._health_server()
        close = [self.transport.close] + ([self.sessions.close] if self._owns_sessions else [])
        try:
            self.consumer_loop().run(close=close)
        finally:
            if probe is not None:
                probe.stop()

    def _health_server(self) -> HealthServer | None:
        if self.runner.health_port is None:
            return None
        checks = {"broker": self.transport.ping, "session_store": self.sessions.ping}
        return HealthServer(self.runner.health_host, self.runner.health_port, checks).start()

    def handling(self) -> MessageHandling:
        """What each INPUT message goes through (on threads or on an event loop)."""
        policy = HandlingPolicy(
            max_receive_count=self.queues.input.max_receive_count,
            lease_extension=self.runner.lease_extension,
            isolate_last_attempt=self.runner.isolate_last_attempt,
        )
        return MessageHandling(
            self.process_message,
            self.on_permanent_failure,
            queue=QueueName.INPUT,
            policy=policy,
            on_undecodable=self.on_undecodable,
        )

    def consumer_loop(self, stop: threading.Event | None = None) -> ConsumerLoop:
        """The :class:`ConsumerLoop` that drives this runner on consumer threads.

        Args:
            stop: stops the loop once set; default the process's shutdown event.
        """
        settings = self.queues.input
        self.transport.check_consumer_capacity(QueueName.INPUT, settings.no_of_consumers)
        loop_settings = LoopSettings(
            num_consumers=settings.no_of_consumers,
            batch_size=self.queues.batch_size or 1,
            max_in_flight=self.runner.in_flight_limit(self.transport.queues_in_process),
            stall_warning=self.runner.stall_warning,
            drain_timeout=self.runner.drain_timeout,
        )
        factory = functools.partial(self.transport.create_consumer, QueueName.INPUT)
        return ConsumerLoop(self.handling(), factory, loop_settings, stop)

    # -- one turn ----------------------------------------------------------------------------

    async def process_message(self, message: QueueMessage) -> None:
        request_id = message.attributes.get(ATTR_REQUEST_ID)
        if not request_id:
            logger.error("INPUT message %s has no request_id; dropping it", message.message_id)
            return
        try:
            body = ChatTurnBody.model_validate_json(message.body)
        except ValidationError as exc:
            doc = error_doc("INVALID_REQUEST", first_error(exc), message.group_id or "", request_id)
            await self.replies.reply(message, 400, doc)
            return
        if (refusal := session_mismatch(message, body)) is not None:
            logger.error("refusing INPUT message %s: %s", message.message_id, refusal)
            doc = error_doc("SESSION_MISMATCH", refusal, message.group_id or "", request_id)
            await self.replies.reply(message, 400, doc)
            return
        try:
            await self._run_turn(message, body, request_id)
        except StoreDataLostError as exc:
            await self.replies.refuse(message, body.session_id, request_id, exc)
        except Exception as exc:
            self._last_errors.remember(request_id, exc)
            raise

    async def _run_turn(self, message: QueueMessage, body: ChatTurnBody, request_id: str) -> None:
        session_id = body.session_id
        try:
            agent = self.registry.get(body.agent)
        except AgentNotFoundError as exc:
            await self.replies.reply(
                message, 404, error_doc("AGENT_NOT_FOUND", str(exc), session_id, request_id)
            )
            return
        key, user = key_of(message, session_id), message.attributes.get(ATTR_USER_ID)
        record, stop = await call(
            self.replies.inline,
            self._read_and_start,
            key,
            session_id,
            user,
            request_id,
            message.position,
        )
        if not _owned_by(record, user):
            # Another identity's session: answered as if it did not exist (no existence leak).
            doc = error_doc("NOT_FOUND", "no such session", session_id, request_id)
            await self.replies.reply(message, 404, doc)
            return
        if record.has_applied(request_id, message.position):
            await self.replies.replay(message, session_id, record, request_id)
            return
        if record.owner is None and user is not None:
            record = dataclasses.replace(record, owner=user)  # the first turn claims the session
        if stop is not None:
            await self._stopped_before_start(message, session_id, record, stop)
            return
        if self.last_attempt.runs_alone(message):
            record = await self.last_attempt.start_trial(self.sessions, key, record, request_id)
        turn = turn_of(message, body, agent.name, key, record.state)
        streamed = body.stream or self.stream_all or ATTR_STREAM in message.attributes
        stream = self._streamer(message, turn) if streamed else None
        started = time.perf_counter()
        async with self._watching(request_id) as stopped:
            timeout = self.runner.turn_timeout
            status, doc, state = await execute(agent, turn, stream, timeout, stopped)
        outcome = TurnOutcome(request_id, status, json.dumps(doc))
        try:
            await self.replies.commit_and_reply(message, session_id, record, outcome, state)
        except SessionStateError as exc:  # the agent's doing: every attempt would fail alike
            status, doc = 500, await self.replies.state_not_stored(message, turn, record, exc)
        turn_finished(turn, status, doc, time.perf_counter() - started)

    async def on_undecodable(self, message: QueueMessage) -> None:
        """Answer 400 a message the transport could not decode, when its request id is known."""
        if request_id := message.attributes.get(ATTR_REQUEST_ID):
            text = f"the message could not be decoded: {message.undecodable}"
            doc = error_doc("UNDECODABLE_MESSAGE", text, message.group_id or "", request_id)
            await self.replies.reply(message, 400, doc)

    async def on_permanent_failure(self, message: QueueMessage) -> None:
        request_id = message.attributes.get(ATTR_REQUEST_ID)
        if not request_id:
            logger.error("abandoning message %s: no request_id to answer", message.message_id)
            return
        session_id = session_of(message)
        try:
            record = await self.replies.read(key_of(message, session_id))
        except StoreDataLostError as exc:
            await self.replies.refuse(message, session_id, request_id, exc)
            return
        if record.has_applied(request_id, message.position):  # it did finish; only its ack was lost
            await self.replies.replay(message, session_id, record, request_id)
            return
        if self.last_attempt.owed_a_run(message, record, request_id):
            # Its deliveries were all used up by crashes of turns running beside it: it never
            # had its run alone. Give it that run now, answering it whatever happens.
            logger.warning(
                "turn %s of session %s used %s deliveries without running alone; running it",
                request_id,
                session_id,
                message.receive_count - 1,
            )
            try:
                await self.process_message(message)
                return
            except Exception as exc:  # answered below, as this may be the last delivery
                self._last_errors.remember(request_id, exc)
                record = await self.replies.read(key_of(message, session_id))
        attempts, cause = message.receive_count - 1, self._last_errors.get(request_id)
        logger.error(
            "turn %s of session %s failed on %s attempts and is abandoned; last error: %s",
            request_id,
            session_id,
            attempts,
            cause,
        )
        doc = turn_failed_doc(attempts, cause, session_id, request_id)
        outcome = TurnOutcome(request_id, 500, json.dumps(doc))
        await self.replies.commit_and_reply(message, session_id, record, outcome, None)

    # -- turn control (pipeline.turn_control) ---------------------------------------------------

    def _read_and_start(
        self,
        key: str,
        session_id: str,
        user: str | None,
        request_id: str,
        position: Position | None,
    ) -> tuple[SessionRecord, Stop | None]:
        """Read the turn's session record and, if the turn is to run (the caller's session,
        not applied yet), mark it as started: one thread hop for both (blocking).

        Returns:
            the record, and the stop asked for the turn before it started, if any (then it
            must not run).
        """
        record = self.adoption.read(key, session_id, user)
        signals = self.signals
        if signals is None or not _owned_by(record, user):
            return record, None
        if record.has_applied(request_id, position):
            return record, None
        return record, signals.start(key, request_id)

    def _watching(
        self, request_id: str
    ) -> AbstractAsyncContextManager[asyncio.Future[Stop] | None]:
        if self.watcher is None:
            return contextlib.nullcontext(None)
        return self.watcher.watching(request_id)

    async def _stopped_before_start(
        self, message: QueueMessage, session_id: str, record: SessionRecord, stop: Stop
    ) -> None:
        """A turn cancelled or superseded while it was queued: answered, never run."""
        request_id = message.attributes[ATTR_REQUEST_ID]
        logger.info(
            "turn %s of session %s was stopped before it started: %s",
            request_id,
            session_id,
            stop.kind.value,
        )
        METRICS.inc("agentkernel_turns_total", agent="-", status="cancelled")
        status, doc = stopped_doc(stop, session_id, request_id)
        outcome = TurnOutcome(request_id, status, json.dumps(doc))
        await self.replies.commit_and_reply(message, session_id, record, outcome, None)

    def _streamer(self, message: QueueMessage, turn: Turn) -> Streamer:
        return Streamer(self.transport, message, turn)


def _owned_by(record: SessionRecord, user: str | None) -> bool:
    """Whether the session of ``record`` is ``user``'s to use (unowned sessions are anyone's)."""
    return record.owner is None or user == record.owner
