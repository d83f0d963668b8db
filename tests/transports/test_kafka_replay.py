"""A replay longer than the session record's id window is still recognised (Kafka, real broker).

The issue this guards against: one partition, a long turn of one session stays in flight while
another session finishes 70 quick turns behind it, so the committed offset cannot pass the long
turn. The runner is then replaced and its in-memory bookkeeping is gone: all 70 records are
delivered again. The record remembers only the latest 64 request ids, so without positions the
first replayed turn fell outside, ran, was committed, and pushed the next one out: 140 runs.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from agentkernel import Agent, AgentRegistry, Turn
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store.base import REMEMBERED_TURNS
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.transport.bookkeeping import InMemoryBookkeepingStore
from agentkernel.pipeline.transport.kafka import KafkaConsumer, KafkaTransport
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, QueueMessage, QueueName
from tests.runner_config import config_with
from tests.transports.test_kafka import kafka_settings

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

QUICK_TURNS = 70
FETCH_WAIT = 20.0


class Recorder:
    """Keeps every prompt in the session state and counts the runs per session."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    async def __call__(self, turn: Turn) -> str:
        self.runs[turn.session_id] = self.runs.get(turn.session_id, 0) + 1
        turn.state.setdefault("prompts", []).append(turn.prompt)
        return str(len(turn.state["prompts"]))


def turn(session: str, n: int) -> QueueMessage:
    request_id = f"{session}-{n}"
    return QueueMessage(
        body=json.dumps({"session_id": session, "prompt": f"p{n}", "agent": "rec"}),
        attributes={ATTR_REQUEST_ID: request_id},
        group_id=session,
        dedup_id=request_id,
    )


def settle(consumer: KafkaConsumer, runner: AgentRunner, wanted: int, hold: str) -> int:
    """Run and ack every fetched turn except those of session ``hold`` until ``wanted`` done."""
    done, deadline = 0, time.monotonic() + 60
    while done < wanted:
        assert time.monotonic() < deadline, f"only {done} of {wanted} turns came"
        for message in consumer.fetch(10, FETCH_WAIT):
            if message.group_id == hold:
                continue  # the long turn: in flight until the runner is replaced
            asyncio.run(runner.process_message(message))
            consumer.ack(message)
            done += 1
    return done


def test_a_replay_past_the_id_window_applies_nothing_twice(
    tansu_broker: Any, redis_url: str
) -> None:
    assert QUICK_TURNS > REMEMBERED_TURNS
    settings = kafka_settings(tansu_broker.bootstrap, partitions=1, dedup_window=0.01)
    sessions = RedisSessionStore(redis_url, prefix=f"t:{uuid.uuid4().hex}:")
    agent = Recorder()
    registry = AgentRegistry()
    registry.register(Agent("rec", agent))
    long, quick = f"long-{uuid.uuid4().hex[:6]}", f"quick-{uuid.uuid4().hex[:6]}"

    def runner_on(transport: KafkaTransport) -> AgentRunner:
        config = config_with(RunnerConfig())
        return AgentRunner(config, registry, transport=transport, sessions=sessions)

    first = KafkaTransport(settings, InMemoryBookkeepingStore())
    first.send(QueueName.INPUT, turn(long, 0))
    for n in range(QUICK_TURNS):
        first.send(QueueName.INPUT, turn(quick, n))
    consumer = first.create_consumer(QueueName.INPUT)
    settle(consumer, runner_on(first), QUICK_TURNS, hold=long)
    consumer.close()  # the commit cannot pass the long turn, still in flight
    first.close()

    # The replacement runner: same group, bookkeeping that forgot everything.
    second = KafkaTransport(settings, InMemoryBookkeepingStore())
    consumer = second.create_consumer(QueueName.INPUT)
    try:
        settle(consumer, runner_on(second), QUICK_TURNS + 1, hold="")
        second.send(QueueName.INPUT, turn(quick, QUICK_TURNS))
        settle(consumer, runner_on(second), 1, hold="")
    finally:
        consumer.close()
        second.close()
    assert agent.runs == {long: 1, quick: QUICK_TURNS + 1}
    prompts = sessions.load(quick)["prompts"]
    assert prompts == [f"p{n}" for n in range(QUICK_TURNS + 1)]
