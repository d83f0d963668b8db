"""The Agent Runner: INPUT queue -> agent turn -> OUTPUT queue.

Turns run as asyncio tasks, so one process keeps up to ``execution.runner.max_in_flight`` turns
going whatever its number of consumer threads; a session's next turn is only fetched once the
previous one was acknowledged, which happens after its state was saved and its reply was sent.

Outcomes of a turn:

- success: reply ``200 {"result", "session_id", "request_id", "agent"}``;
- bad request on the queue (not JSON, missing fields): reply 400, not retried;
- unknown agent: reply 404; the agent raised: reply 500 with a readable message, not retried;
- the agent raised :class:`RetryableError`, or the reply could not be sent: the message is
  delivered again, and after ``max_receive_count`` deliveries the caller gets a 500 reply.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentkernel.core.agent import Agent, AgentRegistry, Turn
from agentkernel.core.config import AKConfig, QueuesConfig, RunnerConfig
from agentkernel.core.errors import AgentNotFoundError, RetryableError
from agentkernel.pipeline.blocking import call
from agentkernel.pipeline.consumer import ConsumerLoop, QueueConsumer
from agentkernel.pipeline.envelope import (
    ATTR_REQUEST_ID,
    ATTR_STATUS_CODE,
    ATTR_TRACEPARENT,
    ATTR_USER_ID,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.metrics import METRICS
from agentkernel.pipeline.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.base import QueueTransport, QueueTransportFactory
from agentkernel.session import SessionStore, create_session_store

logger = logging.getLogger(__name__)

FORWARDED_ATTRIBUTES = (ATTR_USER_ID, ATTR_TRACEPARENT)


class ChatTurnBody(BaseModel):
    """The INPUT message body: what the client asked for."""

    model_config = ConfigDict(extra="allow")

    session_id: str = Field(min_length=1)
    prompt: str
    agent: str | None = None


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

    # -- entry points ----------------------------------------------------------------------

    @classmethod
    def run(cls) -> None:
        """Process entry: build everything from configuration and consume until SIGTERM."""
        queues = AKConfig.get().execution.queues
        runner = cls(QueueTransportFactory.create(queues))
        ThreadRunner.install_signal_handlers()
        runner.consumer_loop().run(close=[runner.transport.close])

    def consumer_loop(
        self, exit_on_shutdown: bool = True, stop_on_shutdown: bool = True
    ) -> ConsumerLoop:
        """The :class:`ConsumerLoop` that drives this runner (see :class:`ConsumerLoop`)."""
        settings = self.queues.input
        self.transport.check_consumer_capacity(QueueName.INPUT, settings.no_of_consumers)
        return ConsumerLoop(
            process=self.process_message,
            on_permanent_failure=self.on_permanent_failure,
            consumer_factory=lambda: self.transport.create_consumer(QueueName.INPUT),
            max_receive_count=settings.max_receive_count,
            num_consumers=settings.no_of_consumers,
            batch_size=self.queues.batch_size or 1,
            max_in_flight=self.runner.max_in_flight,
            lease_extension=self.runner.lease_extension,
            queue=QueueName.INPUT,
            exit_on_shutdown=exit_on_shutdown,
            stop_on_shutdown=stop_on_shutdown,
            drain_timeout=self.runner.drain_timeout,
        )

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
        await self._run_turn(message, body, request_id)

    async def _run_turn(self, message: QueueMessage, body: ChatTurnBody, request_id: str) -> None:
        session_id = body.session_id
        try:
            agent = self.registry.get(body.agent)
        except AgentNotFoundError as exc:
            await self._reply(
                message, 404, error_doc("AGENT_NOT_FOUND", str(exc), session_id, request_id)
            )
            return
        state = await call(self.sessions.nonblocking, self.sessions.load, session_id)
        turn = Turn(
            prompt=body.prompt,
            session_id=session_id,
            request_id=request_id,
            agent=agent.name,
            state=state,
            extra=body.model_extra or {},
            attempt=message.receive_count,
            traceparent=message.attributes.get(ATTR_TRACEPARENT),
        )
        status, doc = await self._execute(agent, turn)
        await self._reply(message, status, doc)

    async def _execute(self, agent: Agent, turn: Turn) -> tuple[int, dict[str, Any]]:
        """Run the agent and save the state; returns the reply's status and body."""
        started = time.perf_counter()
        METRICS.inc("agentkernel_turns_in_flight", 1)
        try:
            result = await agent.run(turn)
            await call(self.sessions.nonblocking, self.sessions.save, turn.session_id, turn.state)
        except RetryableError:
            self._finished(turn.agent, "retry", started)
            raise
        except Exception as exc:
            logger.warning(
                "agent %s failed on request %s", turn.agent, turn.request_id, exc_info=True
            )
            self._finished(turn.agent, "error", started)
            message = f"agent '{turn.agent}' failed: {type(exc).__name__}: {exc}"
            return 500, error_doc("AGENT_ERROR", message, turn.session_id, turn.request_id)
        finally:
            METRICS.inc("agentkernel_turns_in_flight", -1)
        self._finished(turn.agent, "ok", started)
        doc = {"result": result, "session_id": turn.session_id, "request_id": turn.request_id}
        return 200, doc | {"agent": turn.agent}

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
        attempts = message.receive_count - 1
        text = f"the turn failed on {attempts} attempts and was abandoned"
        session_id = _session_of(message)
        await self._reply(message, 500, error_doc("TURN_FAILED", text, session_id, request_id))

    async def _reply(self, message: QueueMessage, status: int, doc: dict[str, Any]) -> None:
        request_id = doc["request_id"]
        attributes = {ATTR_REQUEST_ID: request_id, ATTR_STATUS_CODE: str(status)}
        attributes |= {
            k: message.attributes[k] for k in FORWARDED_ATTRIBUTES if k in message.attributes
        }
        reply = QueueMessage(
            body=json.dumps(doc),
            attributes=attributes,
            group_id=doc.get("session_id") or message.group_id,
            dedup_id=f"{request_id}:reply",
        )
        await call(self.transport.nonblocking, self.transport.send, QueueName.OUTPUT, reply)


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
