"""Positions of a NATS stream that another process deleted and declared again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.nats import NatsTransport
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.runner_config import config_with
from tests.transports.nats_sync import nats
from tests.transports.test_nats import settings

pytestmark = pytest.mark.nats


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    NatsTransport.reset()


def turn(request_id: str) -> QueueMessage:
    body = json.dumps({"session_id": "s", "prompt": request_id, "agent": "echo"})
    return QueueMessage(body=body, attributes={"request_id": request_id}, group_id="s")


def test_a_stream_declared_again_elsewhere_does_not_make_new_turns_look_like_replays(
    nats_url: str,
) -> None:
    """The new stream numbers from 1 again. A process that had not re-read the stream stamped
    its messages with the old stream's unit, so the session's next turns (sequence 1, 2, ...
    below the applied 3) were taken for replays: not run, and never answered."""
    config = settings(nats_url, partitions=1, ack_wait=30.0)
    here = nats(config)
    here._watch.stop()  # its periodic re-read would hide the window this test is about
    registry = AgentRegistry()
    registry.register(Agent("echo", lambda t: t.prompt))
    sessions = InMemorySessionStore()
    runner = AgentRunner(config_with(RunnerConfig()), registry, transport=here, sessions=sessions)

    consumer = here.create_consumer(QueueName.INPUT)  # lives through the change, as a runner's

    def run_one(sender: SyncTransport, request_id: str) -> None:
        sender.send(QueueName.INPUT, turn(request_id))
        [message] = consumer.fetch(1, 5.0)
        asyncio.run(runner.process_message(message))
        consumer.ack(message)

    for i in range(3):
        run_one(here, f"old-{i}")
    here.run(here.conn.js.delete_stream(config.input_stream))
    there = nats(config)  # another process declares the stream and its consumers again
    there.create_consumer(QueueName.INPUT).close()
    run_one(there, "new-0")
    consumer.close()
    record = sessions.read("s")
    assert record.version == 4, "the turn on the new stream was not run"
    assert record.last is not None and record.last.request_id == "new-0"
