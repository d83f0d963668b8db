"""Chunks yielded while a send is on its way travel together in the next OUTPUT message.

The Streamer runs against the in-memory broker made to block like a real one (each send takes a
few milliseconds on a worker thread); the response handler then stores what it sent, and a
client reads one frame per chunk, in order, whatever travelled together.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from agentkernel import Agent, RetryableError, Turn
from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.errors import TransportError
from agentkernel.pipeline.response_store.frames import chunk_frames, read_frames
from agentkernel.pipeline.response_store.handler import ResponseHandler
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.runner.execution import Streamer
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import (
    ATTR_CHUNK_INDEX,
    ATTR_REQUEST_ID,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.wire.records import ResponseRecord

SEND_SECONDS = 0.005


class SlowTransport(InMemoryTransport):
    """The in-memory broker, but each send blocks like a broker's round trip (and its replies
    are stored elsewhere, as on a broker)."""

    nonblocking = False
    queues_in_process = False

    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__()
        self.sent = 0
        self.fail_after = fail_after
        self.lock = threading.Lock()

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        time.sleep(SEND_SECONDS)
        with self.lock:
            if self.fail_after is not None and self.sent >= self.fail_after:
                raise TransportError("the broker went away")
            self.sent += 1
        return super().send(queue, message)


class SmallBatches(Streamer):
    MAX_BATCH_BYTES: ClassVar[int] = 200


def turn() -> Turn:
    return Turn(prompt="p", session_id="s", request_id="r1", agent="a", state={})


def ticking(count: int, text: str = "tok") -> Agent:
    """An agent that yields ``count`` chunks, letting the loop run between them."""

    async def handler(turn: Turn) -> AsyncIterator[str]:
        for i in range(count):
            yield f"{text}{i} "
            await asyncio.sleep(0.0005)

    return Agent("a", handler)


def sent(transport: InMemoryTransport) -> list[QueueMessage]:
    consumer = transport.create_consumer(QueueName.OUTPUT)
    found = []
    while batch := consumer.fetch(10, 0.05):
        for message in batch:
            consumer.ack(message)
            found.append(message)
    return found


def frames_of(messages: list[QueueMessage]) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    for message in messages:
        decoded = chunk_frames(message.attributes[ATTR_CHUNK_INDEX], json.loads(message.body))
        assert decoded is not None, message
        first, batch = decoded
        assert first == len(frames)
        frames += batch
    return frames


def run(streamer: Streamer, agent: Agent) -> str:
    return asyncio.run(streamer.run(agent))


def test_the_first_chunk_goes_alone_and_later_ones_together_in_order() -> None:
    transport = SlowTransport()
    result = run(Streamer(transport, QueueMessage(), turn()), ticking(60))
    messages = sent(transport)
    frames = frames_of(messages)
    assert [f["delta"] for f in frames] == [f"tok{i} " for i in range(60)]
    assert [f["index"] for f in frames] == list(range(60))
    assert result == "".join(f["delta"] for f in frames)
    assert messages[0].attributes[ATTR_CHUNK_INDEX] == "0"
    assert 2 <= len(messages) < 30  # about one message per send time, not one per chunk
    spans = [m.attributes[ATTR_CHUNK_INDEX] for m in messages]
    assert [m.dedup_id for m in messages] == [f"r1:{span}" for span in spans]
    assert all(m.group_id == "s" and m.attributes[ATTR_REQUEST_ID] == "r1" for m in messages)


def test_a_message_carries_at_most_max_batch_bytes() -> None:
    transport = SlowTransport()
    # Escapes make the body larger than the text: the batch is split until it fits.
    run(SmallBatches(transport, QueueMessage(), turn()), ticking(80, text="\u00e9\u2603"))
    messages = sent(transport)
    assert [f["delta"] for f in frames_of(messages)] == [f"\u00e9\u2603{i} " for i in range(80)]
    assert all(len(m.body.encode()) <= SmallBatches.MAX_BATCH_BYTES for m in messages)


def test_a_chunk_larger_than_a_batch_goes_alone() -> None:
    async def big(turn: Turn) -> AsyncIterator[str]:
        yield "x" * 500
        yield "y"

    transport = SlowTransport()
    assert run(SmallBatches(transport, QueueMessage(), turn()), Agent("a", big)) == "x" * 500 + "y"
    assert [f["delta"] for f in frames_of(sent(transport))] == ["x" * 500, "y"]


class Paced(Streamer):
    MESSAGES_PER_SECOND: ClassVar[float] = 0.5  # one stream alone: 2 s between messages...
    MAX_INTERVAL_SECONDS: ClassVar[float] = 1.5  # ...but never more than this


def test_a_turns_messages_are_spaced_but_its_last_chunks_never_wait() -> None:
    transport = SlowTransport()
    started = time.monotonic()
    run(Paced(transport, QueueMessage(), turn()), ticking(60))  # yields for about 0.05 s
    elapsed = time.monotonic() - started
    messages = sent(transport)
    # The first chunk alone, the rest once the agent is done: not one message per send time.
    assert [m.attributes[ATTR_CHUNK_INDEX] for m in messages] == ["0", "1-59"]
    assert elapsed < Paced.MAX_INTERVAL_SECONDS  # the end did not wait out the interval
    assert not Streamer._active


def test_an_in_process_queue_is_not_paced() -> None:
    class InProcess(SlowTransport):
        queues_in_process = True

    transport = InProcess()
    run(Paced(transport, QueueMessage(), turn()), ticking(60))
    assert len(sent(transport)) > 2  # one message per send time, as without pacing


def test_a_failed_send_fails_the_turn_for_a_retry() -> None:
    with pytest.raises(RetryableError, match="could not be sent"):
        run(Streamer(SlowTransport(fail_after=1), QueueMessage(), turn()), ticking(40))


def test_chunks_yielded_before_the_agent_failed_are_sent() -> None:
    async def failing(turn: Turn) -> AsyncIterator[str]:
        for i in range(20):
            yield f"{i} "
        raise ValueError("the model broke")

    transport = SlowTransport()
    with pytest.raises(ValueError, match="the model broke"):
        run(Streamer(transport, QueueMessage(), turn()), Agent("a", failing))
    assert [f["delta"] for f in frames_of(sent(transport))] == [f"{i} " for i in range(20)]


def test_a_cancelled_turn_leaves_no_send_running() -> None:
    async def cancelled() -> set[asyncio.Task[Any]]:
        work = asyncio.create_task(Streamer(SlowTransport(), QueueMessage(), turn()).run(slow))
        await asyncio.sleep(0.05)
        work.cancel()
        await asyncio.wait({work})
        await asyncio.sleep(0)
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    async def endless(turn: Turn) -> AsyncIterator[str]:
        while True:
            yield "."
            await asyncio.sleep(0.001)

    slow = Agent("a", endless)
    assert asyncio.run(cancelled()) == set()


def test_what_travelled_together_reaches_the_client_as_one_frame_per_chunk() -> None:
    transport, store = SlowTransport(), InMemoryResponseStore()
    run(Streamer(transport, QueueMessage(), turn()), ticking(30))
    handler = ResponseHandler(transport, store, QueuesConfig())
    messages = sent(transport)
    for message in messages + messages[1:]:  # every batch delivered twice: kept once
        handler.process_message(message)
    store.put(ResponseRecord("r1", "s", 200, {"result": "done"}))

    async def read() -> list[dict[str, Any] | None]:
        return [frame async for frame in read_frames(store, "r1", "s", after=4)]

    frames = asyncio.run(read())
    assert [f["index"] for f in frames[:-1]] == list(range(5, 30))  # type: ignore[index]
    assert [f["delta"] for f in frames[:-1]] == [f"tok{i} " for i in range(5, 30)]  # type: ignore[index]
    assert frames[-1] == {
        "type": "STREAM_CHUNK",
        "request_id": "r1",
        "session_id": "s",
        "done": True,
        "result": "done",
    }


@pytest.mark.parametrize(
    ("span", "body"),
    [
        ("0-2", {"deltas": ["a", "b"]}),  # fewer deltas than the span names
        ("2-1", {"deltas": []}),
        ("0-x", {"deltas": ["a"]}),
        ("0-1", {"deltas": "ab"}),
        ("x", {"delta": "a"}),
        ("0", ["a"]),
    ],
)
def test_a_malformed_chunk_message_is_dropped(span: str, body: object) -> None:
    assert chunk_frames(span, body) is None
    store = InMemoryResponseStore()
    message = QueueMessage(
        body=json.dumps(body), attributes={ATTR_REQUEST_ID: "r", ATTR_CHUNK_INDEX: span}
    )
    ResponseHandler(InMemoryTransport(), store, QueuesConfig()).process_message(message)
    assert store.chunks("r") == [] and store.get("r") is None
