"""Running one turn's agent: its deadline, its metrics, and streaming its reply to OUTPUT."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Any, ClassVar

from agentkernel.core.agent import Agent, Turn
from agentkernel.core.errors import RetryableError
from agentkernel.core.first_done import first_done
from agentkernel.pipeline.response_store.frames import chunk_batch, chunk_frame, chunk_span
from agentkernel.pipeline.runner.last_errors import cause_of
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.transport.blocking import AnyTransport, adapt
from agentkernel.pipeline.turn_control.outcomes import stopped_doc
from agentkernel.pipeline.turn_control.signals import Stop
from agentkernel.pipeline.wire.envelope import (
    ATTR_CHUNK_INDEX,
    ATTR_REQUEST_ID,
    ATTR_TRACEPARENT,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.wire.replies import ChatTurnBody, error_doc, reply_attributes

logger = logging.getLogger(__name__)


#: Seconds a cancelled agent gets to unwind (its ``finally`` blocks, an ``except
#: CancelledError`` that tidies its state) before its turn is answered without it.
CANCEL_GRACE_SECONDS = 1.0

#: A turn's reply: its status and body, and the state to commit (``None``: none).
AgentReply = tuple[int, dict[str, Any], dict[str, Any] | None]


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
    await first_done((task,) if stopped is None else (task, stopped), timeout)
    if task.done():
        return task.result()
    stop = None  # the deadline, unless a stop came first
    if stopped is not None and stopped.done() and not stopped.cancelled():
        stop = stopped.result()
    if stopping is not None:
        stopping.set()
    task.cancel()
    await _unwind(task)
    if stop is not None:
        raise Stopped(stop)
    raise Deadline


async def _unwind(task: asyncio.Task[str]) -> None:
    """Give a cancelled agent :data:`CANCEL_GRACE_SECONDS` to unwind, never longer: one that
    caught its cancellation and runs on is left running (what it returns is not kept), so that
    its turn is answered and its session's next turn can run. A sync agent's thread runs on
    regardless; its task ends at once."""
    await asyncio.wait({task}, timeout=CANCEL_GRACE_SECONDS)
    if task.done():
        return
    logger.error(
        "the agent still runs %ss after its turn was cancelled (it caught the cancellation); "
        "answering the turn without it, and keeping nothing it does from now on",
        CANCEL_GRACE_SECONDS,
    )
    task.add_done_callback(_ended_late)


def _ended_late(task: asyncio.Task[str]) -> None:
    """Read the outcome of an agent left running, so asyncio does not report it as lost."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.debug("an agent left running after its turn ended with %r", exc)


class Streamer:
    """Runs a streaming turn, sending its chunks to OUTPUT while the agent yields them.

    The first chunk goes out at once; the chunks yielded while a send is on its way travel
    together in the next message. A fast agent then costs a few broker messages per turn
    instead of one per chunk. Consecutive messages of one turn are also spaced by the turn's
    share of :attr:`MESSAGES_PER_SECOND` (the streams running in this process divided by it, at
    most :attr:`MAX_INTERVAL_SECONDS`): one stream is not slowed, a hundred model-paced ones
    send a few chunks per message instead of flooding OUTPUT faster than an IO process stores
    it (on an in-process queue there is no such limit, nor pause). The last chunks of a turn
    never wait. The agent runs ahead of the broker by at most one message of chunks
    (:attr:`MAX_BATCH_BYTES`): past that it waits for the send.
    """

    #: Largest body of a message that carries several chunks, in bytes: well under every
    #: broker's limit (SQS: 256 KiB with the attributes). A larger single chunk goes alone.
    MAX_BATCH_BYTES: ClassVar[int] = 64 * 1024
    #: Chunk messages per second this process aims at across all its streams.
    MESSAGES_PER_SECOND: ClassVar[float] = 200.0
    #: Longest pause between two chunk messages of one turn, in seconds (the added delay bound).
    MAX_INTERVAL_SECONDS: ClassVar[float] = 0.25
    #: The streams running in this process (their count sets each one's pace).
    _active: ClassVar[set[Streamer]] = set()

    def __init__(self, transport: AnyTransport, message: QueueMessage, turn: Turn) -> None:
        self._transport, self._turn = adapt(transport), turn
        self._attributes = reply_attributes(message, turn.request_id)
        self._pending: list[str] = []  # yielded, not sent yet; the first has index _next
        self._pending_size = 0
        self._next = 0
        self._sender: asyncio.Task[None] | None = None
        self._failure: RetryableError | None = None
        self._hurry = asyncio.Event()

    async def run(self, agent: Agent) -> str:
        parts: list[str] = []
        self._active.add(self)
        try:
            try:
                async for delta in agent.stream(self._turn):
                    if delta:
                        parts.append(delta)
                        await self._offer(delta)
            except Exception:
                await self._drained()  # what the agent yielded before it failed still goes out
                raise
            await self._drained()
            if self._failure is not None:
                raise self._failure
        finally:
            self._active.discard(self)
            if self._sender is not None:
                self._sender.cancel()  # only still running when the turn was cancelled
        return "".join(parts)

    async def _offer(self, delta: str) -> None:
        if self._turn.stopping.is_set():
            # Cancelled, and the agent yields on (it caught the cancellation): its turn is being
            # answered without it, and no chunk may follow the reply.
            raise asyncio.CancelledError
        if self._failure is not None:
            raise self._failure
        self._pending.append(delta)
        self._pending_size += len(delta)
        if self._next == 0 and len(self._pending) == 1 and self._transport.queues_in_process:
            await self._send_batch()  # the first chunk, on an in-process queue: sent inline
        elif self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_pending())
        elif self._pending_size >= self.MAX_BATCH_BYTES:
            await self._drained()  # a full message waits already: the agent waits for the broker
            self._hurry.clear()

    async def _drained(self) -> None:
        self._hurry.set()
        sender = self._sender
        if sender is not None:
            await asyncio.wait({sender})
            if not sender.cancelled() and (error := sender.exception()) is not None:
                raise error  # not a broker failure (those are kept in _failure): a bug

    async def _send_pending(self) -> None:
        """Send what is pending, one message at a time, until nothing is (or a send failed)."""
        try:
            while self._pending:
                started = time.monotonic()
                await self._send_batch()
                await self._pace(started)
        except RetryableError as exc:
            self._failure = exc

    async def _send_batch(self) -> None:
        """Send the first pending chunks in one message."""
        first, count, body = self._next, *self._batch()
        await self._send(first, count, body)
        del self._pending[:count]
        self._pending_size = sum(map(len, self._pending))
        self._next += count

    async def _pace(self, started: float) -> None:
        """Wait out this stream's share of the process's chunk messages (see the class), unless
        the agent is done or waits for the broker (:meth:`_drained`)."""
        if self._transport.queues_in_process:
            return  # its replies are stored by this process as fast as they come: no flood
        interval = min(self.MAX_INTERVAL_SECONDS, len(self._active) / self.MESSAGES_PER_SECOND)
        wait = interval - (time.monotonic() - started)
        if wait > 0 and not self._hurry.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), wait)

    def _batch(self) -> tuple[int, str]:
        """How many pending chunks the next message carries, and its body."""
        count, size = 0, 0
        for delta in self._pending:
            if count and size + len(delta) > self.MAX_BATCH_BYTES:
                break
            count, size = count + 1, size + len(delta)
        body = self._body(count)
        while count > 1 and len(body) > self.MAX_BATCH_BYTES:  # escapes made it larger
            count //= 2
            body = self._body(count)
        return count, body

    def _body(self, count: int) -> str:
        turn, first = self._turn, self._next
        if count == 1:
            frame = chunk_frame(turn.request_id, turn.session_id, first, self._pending[0])
        else:
            deltas = self._pending[:count]
            frame = chunk_batch(turn.request_id, turn.session_id, first, deltas)
        return json.dumps(frame)

    async def _send(self, first: int, count: int, body: str) -> None:
        turn, span = self._turn, chunk_span(first, count)
        chunk = QueueMessage(
            body=body,
            attributes=self._attributes | {ATTR_CHUNK_INDEX: span},
            group_id=turn.session_id,
            dedup_id=f"{turn.request_id}:{span}",
        )
        transport = self._transport
        try:
            await transport.send(QueueName.OUTPUT, chunk)
        except Exception as exc:  # the broker, not the agent, failed: run the turn again
            raise RetryableError(f"chunks {span} could not be sent: {exc}") from exc


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
        # the record keeps the state before the turn (a new session's is empty: nothing to copy)
        state=copy.deepcopy(state) if state else {},
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
) -> AgentReply:
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
        return _stopped(turn, exc.stop, started)
    except Deadline:
        return _timed_out(turn, timeout, started)
    except RetryableError:
        _finished(turn.agent, "retry", started)
        raise
    except Exception as exc:
        return _failed(turn, exc, started)
    finally:
        METRICS.inc("agentkernel_turns_in_flight", -1)
    _finished(turn.agent, "ok", started)
    doc = {"result": result, "session_id": turn.session_id, "request_id": turn.request_id}
    # attempt: the delivery that produced this reply (1 unless the turn was redelivered)
    return 200, doc | {"agent": turn.agent, "attempt": turn.attempt}, turn.state


def _stopped(turn: Turn, stop: Stop, started: float) -> AgentReply:
    """The answer of a turn asked to stop; its state is kept only if the stop says so."""
    logger.info(
        "turn %s of session %s in agent %s stopped: %s",
        turn.request_id,
        turn.session_id,
        turn.agent,
        stop.kind.value,
    )
    _finished(turn.agent, "cancelled", started)
    status, doc = stopped_doc(stop, turn.session_id, turn.request_id)
    return status, doc, turn.state if stop.keeps_state else None


def _timed_out(turn: Turn, timeout: float | None, started: float) -> AgentReply:
    """The 504 of a turn cancelled at its deadline (``timeout`` seconds)."""
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


def _failed(turn: Turn, exc: Exception, started: float) -> AgentReply:
    """The 500 of a turn whose agent raised ``exc`` (logged with its traceback)."""
    logger.error(
        "turn %s of session %s failed in agent %s on attempt %s: %s: %s",
        turn.request_id,
        turn.session_id,
        turn.agent,
        turn.attempt,
        type(exc).__name__,
        exc,
        exc_info=exc,
    )
    _finished(turn.agent, "error", started)
    message = f"agent '{turn.agent}' failed: {cause_of(exc)}"
    return 500, error_doc("AGENT_ERROR", message, turn.session_id, turn.request_id), None


def _finished(agent: str, status: str, started: float) -> None:
    METRICS.inc("agentkernel_turns_total", agent=agent, status=status)
    METRICS.observe("agentkernel_turn_duration_seconds", time.perf_counter() - started, agent=agent)
