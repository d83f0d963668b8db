"""The runner closes a turn in its session when it commits the turn's outcome, before the reply
goes out: whoever reads the reply finds the session free for a ``reject`` turn. The close stays
best effort: when the signals fail, the turn is still committed and answered.

Runs the Agent Runner's message path directly, on the in-memory broker (replies sent from a
worker thread) and on NATS (replies published on the client's loop), with the sessions and
their signals in memory or in Redis.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest
from tests.runner_config import config_with

from agentkernel import Agent, AgentRegistry, Turn
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.core.errors import SessionStoreUnavailableError
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store import SessionStore
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.turn_control.signals import InMemoryTurnSignals, TurnSignals
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, QueueMessage, QueueName


@pytest.fixture(params=["in_memory", pytest.param("redis", marks=pytest.mark.redis)])
def sessions(request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    if request.param == "in_memory":
        yield InMemorySessionStore()
        return
    store = RedisSessionStore(request.getfixturevalue("redis_url"), prefix=f"t:{uuid.uuid4()}:")
    yield store
    store.close()


def open_turns(signals: TurnSignals, key: str) -> list[str]:
    """The session's open turns, as a ``reject`` turn sees them (it opens only when none are)."""
    probe = f"probe-{uuid.uuid4().hex}"
    others = signals.open(key, probe, exclusive=True)
    signals.close(key, probe)
    return others


class Witness:
    """Records the open turns of a reply's session at the moment the reply is sent."""

    def __init__(self) -> None:
        self.signals: TurnSignals | None = None
        self.seen: list[list[str]] = []

    def look(self, queue: QueueName, message: QueueMessage) -> None:
        if queue is QueueName.OUTPUT and self.signals is not None and message.group_id:
            self.seen.append(open_turns(self.signals, message.group_id))


def in_memory_transport(witness: Witness) -> QueueTransport:
    class Watched(InMemoryTransport):
        def send(self, queue: QueueName, message: QueueMessage) -> str | None:
            witness.look(queue, message)
            return super().send(queue, message)

    return Watched()


def nats_transport(witness: Witness, nats_url: str) -> QueueTransport:
    from tests.transports.test_nats import settings

    from agentkernel.pipeline.transport.nats import NatsTransport

    class Watched(NatsTransport):
        async def send(self, queue: QueueName, message: QueueMessage) -> str | None:
            await asyncio.to_thread(witness.look, queue, message)
            return await super().send(queue, message)

    return Watched(settings(nats_url), {QueueName.INPUT: 10, QueueName.OUTPUT: 10})


@pytest.fixture(params=["in_memory", pytest.param("nats", marks=pytest.mark.nats)])
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[QueueTransport, Witness]]:
    witness = Witness()
    if request.param == "in_memory":
        transport = in_memory_transport(witness)
    else:
        transport = nats_transport(witness, request.getfixturevalue("nats_url"))
    yield transport, witness
    transport.close()


async def answer(turn: Turn) -> str:
    turn.state["turns"] = turn.state.get("turns", 0) + 1
    return "ok"


def make_runner(transport: QueueTransport, sessions: SessionStore) -> AgentRunner:
    registry = AgentRegistry()
    registry.register(Agent("echo", answer))
    config = config_with(RunnerConfig())
    return AgentRunner(config, registry, transport=transport, sessions=sessions)


def delivery(session: str, request_id: str, attempt: int = 1) -> QueueMessage:
    return QueueMessage(
        body=json.dumps({"session_id": session, "prompt": "hi"}),
        attributes={ATTR_REQUEST_ID: request_id},
        group_id=session,
        receive_count=attempt,
    )


def test_a_turn_is_closed_before_its_reply_is_sent(
    broker: tuple[QueueTransport, Witness], sessions: SessionStore
) -> None:
    transport, witness = broker
    runner = make_runner(transport, sessions)
    signals = witness.signals = runner.signals
    assert signals is not None
    session, request_id = f"s-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex}"
    signals.open(session, request_id)  # as the front does before it enqueues the turn
    asyncio.run(runner.process_message(delivery(session, request_id)))
    assert witness.seen == [[]]  # a reject turn sent as the reply went out would have run
    assert sessions.load(session) == {"turns": 1}
    # A delivery of the committed turn again sends its reply again, and closes nothing open.
    asyncio.run(runner.process_message(delivery(session, request_id, attempt=2)))
    assert witness.seen == [[], []]
    assert open_turns(signals, session) == []


class FailingClose(InMemoryTurnSignals):
    """Signals whose store is unreachable when a turn is closed."""

    def close(self, key: str, request_id: str) -> None:
        raise SessionStoreUnavailableError("the signals' store went away")


class SessionsWithFailingClose(InMemorySessionStore):
    def _new_turn_signals(self, stale_after: float) -> TurnSignals:
        return FailingClose(stale_after=stale_after)


def test_a_failed_close_still_commits_and_answers_the_turn(
    broker: tuple[QueueTransport, Witness],
) -> None:
    transport, _ = broker
    sessions = SessionsWithFailingClose()
    runner = make_runner(transport, sessions)
    asyncio.run(runner.process_message(delivery("f", "r1")))
    assert sessions.load("f") == {"turns": 1}
    consumer = SyncTransport(transport).create_consumer(QueueName.OUTPUT)
    try:
        batch = consumer.fetch(10, 5)
        for message in batch:
            consumer.ack(message)
    finally:
        consumer.close()
    assert [(m.attributes[ATTR_REQUEST_ID], json.loads(m.body)["result"]) for m in batch] == [
        ("r1", "ok")
    ]
