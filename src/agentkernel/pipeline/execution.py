"""Running one turn's agent: its deadline, its metrics, and streaming its reply to OUTPUT."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Any

from agentkernel.core.agent import Agent, Turn
from agentkernel.core.blocking import call
from agentkernel.core.errors import RetryableError
from agentkernel.pipeline.envelope import (
    ATTR_CHUNK_INDEX,
    ATTR_REQUEST_ID,
    ATTR_TRACEPARENT,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.frames import chunk_frame
from agentkernel.pipeline.last_errors import cause_of
from agentkernel.pipeline.process.metrics import METRICS
from agentkernel.pipeline.replies import ChatTurnBody, error_doc, reply_attributes
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.turn_control.outcomes import stopped_doc
from agentkernel.pipeline.turn_control.signals import Stop

logger = logging.getLogger(__name__)


#: Seconds a cancelled agent gets to unwind (its ``finally`` blocks, an ``except
#: CancelledError`` that tidies its state) before its turn is answered without it.
CANCEL_GRACE_SECONDS = 1.0


class Deadline(Exception):
    """A turn ran past its deadline (distinct from a TimeoutError the agent itself raised)."""


class Stopped(Exception):
    """A turn was asked to stop (cancelled, interrupted, rolled back) while it ran."""

    def __init__(self, stop: Stop) -> None:
        super().__init__(stop.kind.value)
        self.stop = stop


async def bounded(
    work: Coroutine[Any, Any, str],
    timeout: float | None,
    stopped: asyncio.Future[Stop] | None = None,
    stopping: threading.Event | None = None,
) -> str:
    """Await ``work``, cancelling it after ``timeout`` seconds (``None``: no limit) or once
    ``stopped`` resolves; ``stopping`` is set when it is cancelled (a sync agent's signal)."""
    if timeout is None and stopped is None:
        return await work
    task = asyncio.ensure_future(work)
    either: set[asyncio.Future[Any]] = {task} if stopped is None else {task, stopped}
    await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    if stopping is not None:
        stopping.set()
    task.cancel()
    if stopped is not None and stopped.done() and not stopped.cancelled():
        # Its unwinding may be awaited for a second, never for long: the caller is waiting.
        await asyncio.wait({task}, timeout=CANCEL_GRACE_SECONDS)
        raise Stopped(stopped.result())
    await asyncio.wait({task})  # let it unwind (a sync agent's thread runs on regardless)
    raise Deadline


class Streamer:
    """Runs a streaming turn, sending each chunk to OUTPUT as the agent yields it."""

    def __init__(self, transport: QueueTransport, message: QueueMessage, turn: Turn) -> None:
        self._transport, self._message, self._turn = transport, message, turn

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
        attributes = reply_attributes(self._message, turn.request_id)
        chunk = QueueMessage(
            body=json.dumps(frame),
            attributes=attributes | {ATTR_CHUNK_INDEX: str(index)},
            group_id=turn.session_id,
            dedup_id=f"{turn.request_id}:{index}",
        )
        transport = self._transport
        try:
            await call(transport.nonblocking, transport.send, QueueName.OUTPUT, chunk)
        except Exception as exc:  # the broker, not the agent, failed: run the turn again
            raise RetryableError(f"chunk {index} could not be sent: {exc}") from exc


def turn_of(
    message: QueueMessage, body: ChatTurnBody, agent: str, key: str, state: dict[str, Any]
) -> Turn:
    """The turn ``message`` asks ``agent`` to run, on a copy of the session's ``state``."""
    return Turn(
        prompt=body.prompt,
        session_id=body.session_id,
        request_id=message.attributes[ATTR_REQUEST_ID],
        agent=agent,
        session_key=key,
        state=copy.deepcopy(state),  # the record keeps the state before the turn
        extra=body.model_extra or {},
        attempt=message.receive_count,
        traceparent=message.attributes.get(ATTR_TRACEPARENT),
    )


async def execute(
    agent: Agent,
    turn: Turn,
    stream: Streamer | None,
    turn_timeout: float | None,
    stopped: asyncio.Future[Stop] | None = None,
) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
    """Run the agent; returns the reply's status and body, and the state to commit.

    Args:
        stream: sends the reply's chunks as the agent yields them (``None``: not streamed).
        turn_timeout: seconds a turn may run when its agent sets no timeout (``None``: no limit).
        stopped: resolves when the turn is asked to stop (:mod:`~.turn_control`); the turn is
            then cancelled and answered by :func:`~.turn_control.outcomes.stopped_doc`.
    """
    started = time.perf_counter()
    METRICS.inc("agentkernel_turns_in_flight", 1)
    timeout = agent.timeout or turn_timeout
    try:
        work = agent.run(turn) if stream is None else stream.run(agent)
        result = await bounded(work, timeout, stopped, turn.stopping)
    except Stopped as exc:
        logger.info(
            "turn %s of session %s in agent %s stopped: %s",
            turn.request_id,
            turn.session_id,
            turn.agent,
            exc.stop.kind.value,
        )
        _finished(turn.agent, "cancelled", started)
        status, doc = stopped_doc(exc.stop, turn.session_id, turn.request_id)
        return status, doc, turn.state if exc.stop.keeps_state else None
    except Deadline:
        logger.error(
            "turn %s of session %s ran past its %ss deadline in agent %s; cancelled",
            turn.request_id,
            turn.session_id,
            timeout,
            turn.agent,
        )
        _finished(turn.agent, "timeout", started)
        message = f"agent '{turn.agent}' did not finish within {timeout} seconds"
        return 504, error_doc("TURN_TIMEOUT", message, turn.session_id, turn.request_id), None
    except RetryableError:
        _finished(turn.agent, "retry", started)
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
        _finished(turn.agent, "error", started)
        message = f"agent '{turn.agent}' failed: {cause_of(exc)}"
        return 500, error_doc("AGENT_ERROR", message, turn.session_id, turn.request_id), None
    finally:
        METRICS.inc("agentkernel_turns_in_flight", -1)
    _finished(turn.agent, "ok", started)
    doc = {"result": result, "session_id": turn.session_id, "request_id": turn.request_id}
    # attempt: the delivery that produced this reply (1 unless the turn was redelivered)
    return 200, doc | {"agent": turn.agent, "attempt": turn.attempt}, turn.state


def _finished(agent: str, status: str, started: float) -> None:
    METRICS.inc("agentkernel_turns_total", agent=agent, status=status)
    METRICS.observe("agentkernel_turn_duration_seconds", time.perf_counter() - started, agent=agent)
