"""A streamed chunk is encoded like a returned value: a dict or list as JSON, ``None`` as nothing.

Checked on the agent (``Agent.stream``/``run``) and on what the runner sends to OUTPUT.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from agentkernel import Agent, AgentRegistry, Turn
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.pipeline.response_store.frames import chunk_frames
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import ATTR_CHUNK_INDEX, ATTR_STREAM, QueueName
from tests.runner_config import config_with
from tests.test_turn_outcomes import delivery

CHUNKS: list[Any] = [{"step": 1, "tool": "search"}, None, "text", ["a", 2], 3]
ENCODED = ['{"step": 1, "tool": "search"}', "", "text", '["a", 2]', "3"]


async def async_chunks(turn: Turn) -> AsyncIterator[Any]:
    for chunk in CHUNKS:
        yield chunk


def sync_chunks(turn: Turn) -> Iterator[Any]:
    yield from CHUNKS


def turn() -> Turn:
    return Turn(prompt="p", session_id="s", request_id="r", agent="a", state={})


async def collect(agent: Agent) -> list[str]:
    return [chunk async for chunk in agent.stream(turn())]


@pytest.mark.parametrize("handler", [async_chunks, sync_chunks])
def test_streamed_chunks_are_encoded_like_returned_values(handler: Any) -> None:
    agent = Agent("a", handler)
    assert asyncio.run(collect(agent)) == ENCODED
    assert asyncio.run(agent.run(turn())) == "".join(ENCODED)


def test_the_runner_sends_json_chunks_and_skips_empty_ones() -> None:
    registry, transport = AgentRegistry(), InMemoryTransport()
    registry.register(Agent("a", async_chunks))
    runner = AgentRunner(
        config_with(RunnerConfig()), registry, transport=transport, sessions=InMemorySessionStore()
    )
    message = delivery("s", "p", "r1")
    message.attributes[ATTR_STREAM] = "1"
    asyncio.run(runner.process_message(message))
    consumer = transport.create_consumer(QueueName.OUTPUT)
    bodies, frames = [], []
    while batch := consumer.fetch(10, 0.05):  # one message of a group at a time, as on a broker
        for message in batch:
            consumer.ack(message)
            bodies.append(json.loads(message.body))
            if span := message.attributes.get(ATTR_CHUNK_INDEX):
                frames += chunk_frames(span, bodies[-1])[1]  # type: ignore[index]
    deltas = [frame["delta"] for frame in frames]
    assert deltas == [e for e in ENCODED if e]
    assert [frame["index"] for frame in frames] == list(range(len(deltas)))
    assert json.loads(deltas[0]) == CHUNKS[0]
    [reply] = [body for body in bodies if "result" in body]
    assert reply["result"] == "".join(ENCODED)
