"""The Agent Runner: INPUT queue -> agent turn -> OUTPUT queue.

Turns run as asyncio tasks, so one process keeps up to ``execution.runner.max_in_flight`` turns
going whatever its number of consumer threads; a session's next turn is only fetched once the
previous one was acknowledged.

A turn's effects happen once: the runner reads the session record, runs the agent, then commits
the new state together with the reply (keyed by ``request_id``, fenced by the session version),
and only then sends the reply and acknowledges the message. A delivery of a turn that is already
committed is not run again: its committed reply is sent again. Delivery stays at-least-once, so
an agent's own side effects (a payment, an e-mail) should use ``turn.request_id`` as their
idempotency key.

Outcomes of a turn:

- success: reply ``200 {"result", "session_id", "request_id", "agent"}``, state committed;
- bad request on the queue (not JSON, missing fields): reply 400, not retried;
- unknown agent: reply 404; the agent raised: reply 500 ``AGENT_ERROR``, committed (so it is
  not run again) with the state left as it was;
- a reply the broker can never carry: 500 ``REPLY_TOO_LARGE``, state left as it was;
- the agent raised :class:`RetryableError`, or the commit or the reply failed: the message is
  delivered again, and after ``max_receive_count`` deliveries the caller gets 500
  ``TURN_FAILED``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentkernel.core.agent import Agent, AgentRegistry, Turn
from agentkernel.core.blocking import call
from agentkernel.core.config import AKConfig, QueuesConfig, RunnerConfig
from agentkernel.core.errors import (
    AgentNotFoundError,
    MessageRejectedError,
    RetryableError,
    StaleSessionError,
)
from agentkernel.pipeline.consumer.base import QueueConsumer
from agentkernel.pipeline.consumer.handling import HandlingPolicy, MessageHandling
from agentkernel.pipeline.consumer.isolation import LastAttempt
from agentkernel.pipeline.consumer.loop import ConsumerLoop, LoopSettings
from agentkernel.pipeline.envelope import (
    ATTR_CHUNK_INDEX,
    ATTR_CONNECTION_ID,
    ATTR_ENDPOINT,
    ATTR_REQUEST_ID,
    ATTR_STATUS_CODE,
    ATTR_STREAM,
    ATTR_TRACEPARENT,
    ATTR_USER_ID,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.frames import chunk_frame
from agentkernel.pipeline.process.metrics import METRICS
from agentkernel.pipeline.process.thread_runner import ThreadRunner
from agentkernel.pipeline.session_store import (
    SessionRecord,
    SessionStore,
    TurnOutcome,
    create_session_store,
)
from agentkernel.pipeline.transport.base import QueueTransport, QueueTransportFactory

logger = logging.getLogger(__name__)

FORWARDED_ATTRIBUTES = (
    ATTR_USER_ID,
    ATTR_TRACEPARENT,
    ATTR_STREAM,
    ATTR_CONNECTION_ID,
    ATTR_ENDPOINT,
)


class ChatTurnBody(BaseModel):
    """The INPUT message body: what the client asked for."""

    model_config = ConfigDict(extra="allow")

    session_id: str = Field(min_length=1)
    prompt: str
    agent: str | None = None
    stream: bool = False


def error_doc(code: str, message: str, session_id: str, request_id: str) -> dict[str, Any]:
    """The body of an error reply."""
    return {"error": code, "message": message, "session_id": session_id, "request_id": request_id}


class AgentRunner(QueueConsumer):
    """Consumes INPUT, runs agent turns, sends replies to OUTPUT.

    Args:
        transport: carries both queues.
        registry: the agents this process runs; default the process-wide registry.
        sessions: per-session state; default from ``session.*``.
        queues: queue settings; default ``execution.queues``.
        runner: runner settings; default ``execution.runner``.
    """

    #: Stream every turn's reply as chunks, whatever the request asked (the stream runner).
    stream_all: ClassVar[bool] = False

    def __init__(
        self,
        transport: QueueTransport,
        *,
        registry: AgentRegistry | None = None,
        sessions: SessionStore | None = None,
        queues: QueuesConfig | None = None,
        runner: RunnerConfig | None = None,
    ) -> None:
        self.transport = transport
        self.registry = registry if registry is not None else AgentRegistry.default()
        if sessions is None or queues is None or runner is None:
            config = AKConfig.get()
            sessions = sessions if sessions is not None else create_session_store(config.session)
            queues = queues if queues is not None else config.execution.queues
            runner = runner if runner is not None else config.execution.runner
        self.sessions, self.queues, self.runner = sessions, queues, runner
        self.last_attempt = LastAttempt(runner.isolate_last_attempt, queues.input.max_receive_count)
        self._last_errors = _LastErrors()

    # -- entry points ----------------------------------------------------------------------

    @classmethod
    def run(cls) -> None:
        """Process entry: build everything from configuration and consume until SIGTERM."""
        queues = AKConfig.get().execution.queues
        runner = cls(QueueTransportFactory.create(queues))
        ThreadRunner.install_signal_handlers()
        runner.consumer_loop().run(close=[runner.transport.close])

    def handling(self) -> MessageHandling:
        """What each INPUT message goes through (on threads or on an event loop)."""
        policy = HandlingPolicy(
            max_receive_count=self.queues.input.max_receive_count,
            lease_extension=self.runner.lease_extension,
            isolate_last_attempt=self.runner.isolate_last_attempt,
        )
        return MessageHandling(
            self.process_message, self.on_permanent_failure, queue=QueueName.INPUT, policy=policy
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
            max_in_flight=self.runner.max_in_flight,
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
            doc = error_doc(
                "INVALID_REQUEST", _first_error(exc), message.group_id or "", request_id
            )
            await self._reply(message, 400, doc)
            return
        try:
            await self._run_turn(message, body, request_id)
        except Exception as exc:
            self._last_errors.remember(request_id, exc)
            raise

    async def _run_turn(self, message: QueueMessage, body: ChatTurnBody, request_id: str) -> None:
        session_id = body.session_id
        try:
            agent = self.registry.get(body.agent)
        except AgentNotFoundError as exc:
            await self._reply(
                message, 404, error_doc("AGENT_NOT_FOUND", str(exc), session_id, request_id)
            )
            return
        record = await self._read(session_id)
        user = message.attributes.get(ATTR_USER_ID)
        if record.owner is not None and user != record.owner:
            # Another identity's session: answered as if it did not exist (no existence leak).
            doc = error_doc("NOT_FOUND", "no such session", session_id, request_id)
            await self._reply(message, 404, doc)
            return
        if record.is_committed(request_id):
            await self._replay(message, session_id, record, request_id)
            return
        if record.owner is None and user is not None:
            record = dataclasses.replace(record, owner=user)  # the first turn claims the session
        if self.last_attempt.runs_alone(message):
            record = await self.last_attempt.start_trial(
                self.sessions, session_id, record, request_id
            )
        turn = Turn(
            prompt=body.prompt,
            session_id=session_id,
            request_id=request_id,
            agent=agent.name,
            state=copy.deepcopy(record.state),  # the record keeps the state before the turn
            extra=body.model_extra or {},
            attempt=message.receive_count,
            traceparent=message.attributes.get(ATTR_TRACEPARENT),
        )
        streamed = body.stream or self.stream_all or ATTR_STREAM in message.attributes
        stream = self._streamer(message, turn) if streamed else None
        status, doc, state = await self._execute(agent, turn, stream)
        outcome = TurnOutcome(request_id, status, json.dumps(doc))
        await self._commit_and_reply(message, session_id, record, outcome, state)

    async def _execute(
        self, agent: Agent, turn: Turn, stream: _Streamer | None = None
    ) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        """Run the agent; returns the reply's status and body, and the state to commit."""
        started = time.perf_counter()
        METRICS.inc("agentkernel_turns_in_flight", 1)
        timeout = agent.timeout or self.runner.turn_timeout
        try:
            work = agent.run(turn) if stream is None else stream.run(agent)
            result = await _bounded(work, timeout)
        except _Deadline:
            logger.error(
                "turn %s of session %s ran past its %ss deadline in agent %s; cancelled",
                turn.request_id,
                turn.session_id,
                timeout,
                turn.agent,
            )
            self._finished(turn.agent, "timeout", started)
            message = f"agent '{turn.agent}' did not finish within {timeout} seconds"
            return 504, error_doc("TURN_TIMEOUT", message, turn.session_id, turn.request_id), None
        except RetryableError:
            self._finished(turn.agent, "retry", started)
            raise
        except Exception as exc:
            logger.error(
                "turn %s of session %s failed in agent %s on attempt %s: %s: %s",
                turn.request_id,
                turn.session_id,
                turn.agent,
                turn.attempt,
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            self._finished(turn.agent, "error", started)
            message = f"agent '{turn.agent}' failed: {type(exc).__name__}: {exc}"
            return 500, error_doc("AGENT_ERROR", message, turn.session_id, turn.request_id), None
        finally:
            METRICS.inc("agentkernel_turns_in_flight", -1)
        self._finished(turn.agent, "ok", started)
        doc = {"result": result, "session_id": turn.session_id, "request_id": turn.request_id}
        return 200, doc | {"agent": turn.agent}, turn.state

    @staticmethod
    def _finished(agent: str, status: str, started: float) -> None:
        METRICS.inc("agentkernel_turns_total", agent=agent, status=status)
        METRICS.observe(
            "agentkernel_turn_duration_seconds", time.perf_counter() - started, agent=agent
        )

    async def on_permanent_failure(self, message: QueueMessage) -> None:
        request_id = message.attributes.get(ATTR_REQUEST_ID)
        if not request_id:
            logger.error("abandoning message %s: no request_id to answer", message.message_id)
            return
        session_id = _session_of(message)
        record = await self._read(session_id)
        if record.is_committed(request_id):  # it did finish; only its acknowledgement was lost
            await self._replay(message, session_id, record, request_id)
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
                record = await self._read(session_id)
        attempts = message.receive_count - 1
        logger.error(
            "turn %s of session %s failed on %s attempts and is abandoned; last error: %s",
            request_id,
            session_id,
            attempts,
            self._last_errors.get(request_id),
        )
        text = f"the turn failed on {attempts} attempts and was abandoned"
        outcome = TurnOutcome(
            request_id, 500, json.dumps(error_doc("TURN_FAILED", text, session_id, request_id))
        )
        await self._commit_and_reply(message, session_id, record, outcome, None)

    # -- committing and replying ---------------------------------------------------------------

    async def _read(self, session_id: str) -> SessionRecord:
        return await call(self.sessions.nonblocking, self.sessions.read, session_id)

    async def _commit_and_reply(
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
        commit = self.sessions.commit
        try:
            await call(self.sessions.nonblocking, commit, session_id, base, outcome, state)
        except StaleSessionError:
            fresh = await self._read(session_id)
            if not fresh.is_committed(outcome.request_id):
                raise
            logger.warning(
                "turn %s of session %s was committed by another attempt; keeping that one",
                outcome.request_id,
                session_id,
            )
            await self._replay(message, session_id, fresh, outcome.request_id)
            return
        try:
            await self._send(message, session_id, outcome)
        except MessageRejectedError as exc:
            await self._reject_reply(message, session_id, base.advance(outcome, state), exc, base)

    async def _replay(
        self, message: QueueMessage, session_id: str, record: SessionRecord, request_id: str
    ) -> None:
        """Answer a delivery of a turn that is already committed, without running it again."""
        METRICS.inc("agentkernel_turns_replayed_total")
        outcome = record.outcome(request_id)
        if outcome is None:
            # Later turns of the session were committed after it, and a session's next turn
            # only starts once the previous one was acknowledged, after its reply was sent.
            logger.info("turn %s of session %s was answered before", request_id, session_id)
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
        commit = self.sessions.commit
        await call(self.sessions.nonblocking, commit, session_id, record, outcome, state)
        await self._send(message, session_id, outcome)

    async def _reply(self, message: QueueMessage, status: int, doc: dict[str, Any]) -> None:
        """Send a reply that commits nothing (the agent did not run)."""
        outcome = TurnOutcome(doc["request_id"], status, json.dumps(doc))
        await self._send(message, doc.get("session_id") or "", outcome)

    @staticmethod
    def reply_attributes(message: QueueMessage, request_id: str) -> dict[str, str]:
        """Attributes of a message answering ``message``: its request id and forwarded ones."""
        forwarded = {
            k: message.attributes[k] for k in FORWARDED_ATTRIBUTES if k in message.attributes
        }
        return {ATTR_REQUEST_ID: request_id} | forwarded

    def _streamer(self, message: QueueMessage, turn: Turn) -> _Streamer:
        return _Streamer(self, message, turn)

    async def _send(self, message: QueueMessage, session_id: str, outcome: TurnOutcome) -> None:
        request_id = outcome.request_id
        attributes = self.reply_attributes(message, request_id)
        attributes[ATTR_STATUS_CODE] = str(outcome.status_code)
        if self.stream_all:
            attributes[ATTR_STREAM] = "1"
        reply = QueueMessage(
            body=outcome.body,
            attributes=attributes,
            group_id=session_id or message.group_id,
            dedup_id=f"{request_id}:reply",
        )
        await call(self.transport.nonblocking, self.transport.send, QueueName.OUTPUT, reply)


class _Deadline(Exception):
    """A turn ran past its deadline (distinct from a TimeoutError the agent itself raised)."""


async def _bounded(work: Coroutine[Any, Any, str], timeout: float | None) -> str:
    """Await ``work``, cancelling it after ``timeout`` seconds (``None``: no limit)."""
    if timeout is None:
        return await work
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        await asyncio.wait({task})  # let it unwind (a sync agent's thread runs on regardless)
        raise _Deadline
    return task.result()


class _Streamer:
    """Runs a streaming turn, sending each chunk to OUTPUT as the agent yields it."""

    def __init__(self, runner: AgentRunner, message: QueueMessage, turn: Turn) -> None:
        self._runner, self._message, self._turn = runner, message, turn

    async def run(self, agent: Agent) -> str:
        parts: list[str] = []
        async for delta in agent.stream(self._turn):
            if delta:
                await self._send(len(parts), delta)
                parts.append(delta)
        return "".join(parts)

    async def _send(self, index: int, delta: str) -> None:
        turn = self._turn
        frame = chunk_frame(turn.request_id, turn.session_id, index, delta)
        attributes = self._runner.reply_attributes(self._message, turn.request_id)
        chunk = QueueMessage(
            body=json.dumps(frame),
            attributes=attributes | {ATTR_CHUNK_INDEX: str(index)},
            group_id=turn.session_id,
            dedup_id=f"{turn.request_id}:{index}",
        )
        transport = self._runner.transport
        try:
            await call(transport.nonblocking, transport.send, QueueName.OUTPUT, chunk)
        except Exception as exc:  # the broker, not the agent, failed: run the turn again
            raise RetryableError(f"chunk {index} could not be sent: {exc}") from exc


class _LastErrors:
    """The last error seen per request id in this process, for the abandonment log line."""

    _SIZE = 1024

    def __init__(self) -> None:
        self._errors: OrderedDict[str, str] = OrderedDict()

    def remember(self, request_id: str, exc: BaseException) -> None:
        self._errors[request_id] = f"{type(exc).__name__}: {exc}"
        self._errors.move_to_end(request_id)
        while len(self._errors) > self._SIZE:
            self._errors.popitem(last=False)

    def get(self, request_id: str) -> str:
        return self._errors.get(
            request_id, "not seen by this process (a crash, a lost lease, or another replica)"
        )


def _session_of(message: QueueMessage) -> str:
    try:
        session = json.loads(message.body).get("session_id")
    except (ValueError, AttributeError):
        session = None
    return str(session or message.group_id or "")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]
