"""A turn's effects happen once: state and reply are committed together, keyed by request id,
fenced by the session version; redeliveries of a committed turn re-send its reply.

Runs the Agent Runner's message path directly against each session store (in memory, Redis,
DynamoDB on moto), with the in-memory transport carrying the replies.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentkernel import Agent, AgentRegistry, RetryableError, Turn
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.core.errors import MessageRejectedError, StaleSessionError
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store import SessionStore
from agentkernel.pipeline.session_store.dynamodb import DynamoDBSessionStore
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, QueueMessage, QueueName
from tests.runner_config import config_with
from tests.stores.test_response_stores import create_table

REPLY_LIMIT = 10_000


class LimitedTransport(InMemoryTransport):
    """The in-memory broker with a message size limit, like every real one has."""

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        if len(message.body) > REPLY_LIMIT:
            raise MessageRejectedError(f"message is {len(message.body)} bytes; limit {REPLY_LIMIT}")
        return super().send(queue, message)


@pytest.fixture(params=["in_memory", "redis", "dynamodb"])
def sessions(request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    if request.param == "in_memory":
        yield InMemorySessionStore()
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
        yield RedisSessionStore(url, prefix=f"t:{uuid.uuid4().hex}:")
    else:
        request.getfixturevalue("aws")
        table = f"sessions-{uuid.uuid4().hex[:8]}"
        create_table(table, "session_id")
        yield DynamoDBSessionStore(table)


class Remembering:
    """An agent that keeps every prompt it saw in the session state and counts its runs."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.gates: dict[str, threading.Event] = {}

    async def __call__(self, turn: Turn) -> str:
        self.runs.append(turn.prompt)
        if gate := self.gates.get(f"{turn.prompt}#{turn.attempt}"):
            await asyncio.to_thread(gate.wait, 10)
        if turn.prompt == "fail":
            raise ValueError("the model said no")
        if turn.prompt == "retry":
            raise RetryableError("try again")
        turn.state.setdefault("seen", []).append(turn.prompt)
        return "BIG" * 10_000 if turn.prompt == "BIG" else json.dumps(turn.state["seen"])


@pytest.fixture
def agent() -> Remembering:
    return Remembering()


@pytest.fixture
def transport() -> InMemoryTransport:
    return LimitedTransport()


@pytest.fixture
def runner(transport: InMemoryTransport, sessions: SessionStore, agent: Remembering) -> AgentRunner:
    registry = AgentRegistry()
    registry.register(Agent("remember", agent))
    return AgentRunner(
        config_with(RunnerConfig()), registry, transport=transport, sessions=sessions
    )


def delivery(session: str, prompt: str, request_id: str, attempt: int = 1) -> QueueMessage:
    return QueueMessage(
        body=json.dumps({"session_id": session, "prompt": prompt}),
        attributes={ATTR_REQUEST_ID: request_id},
        group_id=session,
        receive_count=attempt,
    )


def replies(transport: InMemoryTransport) -> list[dict[str, Any]]:
    consumer = transport.create_consumer(QueueName.OUTPUT)
    found = []
    while batch := consumer.fetch(10, 0.05):
        for message in batch:
            consumer.ack(message)
            found.append(json.loads(message.body) | {"status": message.attributes["status_code"]})
    return found


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_redelivered_committed_turn_is_not_run_again(
    runner: AgentRunner, transport: InMemoryTransport, agent: Remembering
) -> None:
    run(runner.process_message(delivery("s", "first", "r1")))
    first = replies(transport)
    # The acknowledgement was lost (a kill after the commit): the same turn comes back.
    run(runner.process_message(delivery("s", "first", "r1", attempt=2)))
    run(runner.process_message(delivery("s", "second", "r2")))
    assert agent.runs == ["first", "second"]
    assert runner.sessions.load("s") == {"seen": ["first", "second"]}
    assert [r["result"] for r in first] == ['["first"]']


def test_the_committed_reply_is_sent_again_when_the_first_send_failed(
    sessions: SessionStore, agent: Remembering
) -> None:
    class FlakyOutput(InMemoryTransport):
        failures = 1

        def send(self, queue: QueueName, message: QueueMessage) -> str | None:
            if queue is QueueName.OUTPUT and self.failures:
                self.failures -= 1
                raise ConnectionError("broker went away")
            return super().send(queue, message)

    transport = FlakyOutput()
    registry = AgentRegistry()
    registry.register(Agent("remember", agent))
    runner = AgentRunner(
        config_with(RunnerConfig()), registry, transport=transport, sessions=sessions
    )
    with pytest.raises(ConnectionError):
        run(runner.process_message(delivery("s", "first", "r1")))
    run(runner.process_message(delivery("s", "first", "r1", attempt=2)))
    assert agent.runs == ["first"]
    assert [r["result"] for r in replies(transport)] == ['["first"]']
    assert sessions.load("s") == {"seen": ["first"]}


def test_a_zombie_attempt_loses_to_the_redelivered_copy(
    runner: AgentRunner, transport: InMemoryTransport, agent: Remembering
) -> None:
    """Attempt 1 outlives its lease; attempt 2 runs and commits; attempt 1 must not save."""
    agent.gates["hello#1"] = gate = threading.Event()

    async def both() -> None:
        zombie = asyncio.create_task(runner.process_message(delivery("z", "hello", "r1")))
        await asyncio.sleep(0.2)
        await runner.process_message(delivery("z", "hello", "r1", attempt=2))
        gate.set()
        await zombie

    run(both())
    assert agent.runs == ["hello", "hello"]  # it did run twice (at-least-once delivery)...
    assert runner.sessions.load("z") == {"seen": ["hello"]}  # ...but its effects happened once
    assert {r["result"] for r in replies(transport)} == {'["hello"]'}


def test_a_stale_attempt_of_another_turn_is_retried_on_fresh_state(
    runner: AgentRunner, agent: Remembering
) -> None:
    agent.gates["slow#1"] = gate = threading.Event()

    async def interleaved() -> None:
        slow = asyncio.create_task(runner.process_message(delivery("x", "slow", "r1")))
        await asyncio.sleep(0.2)
        runner.sessions.save("x", {"seen": ["written meanwhile"]})
        gate.set()
        with pytest.raises(StaleSessionError):
            await slow

    run(interleaved())
    run(runner.process_message(delivery("x", "slow", "r1", attempt=2)))
    assert runner.sessions.load("x") == {"seen": ["written meanwhile", "slow"]}


def test_an_agent_error_is_committed_and_not_run_again(
    runner: AgentRunner, transport: InMemoryTransport, agent: Remembering
) -> None:
    run(runner.process_message(delivery("e", "ok", "r0")))
    run(runner.process_message(delivery("e", "fail", "r1")))
    run(runner.process_message(delivery("e", "fail", "r1", attempt=2)))
    assert agent.runs == ["ok", "fail"]
    errors = [r for r in replies(transport) if r["status"] == "500"]
    assert [e["error"] for e in errors] == ["AGENT_ERROR"]
    assert runner.sessions.load("e") == {"seen": ["ok"]}


def test_a_retryable_error_commits_nothing(runner: AgentRunner) -> None:
    with pytest.raises(RetryableError):
        run(runner.process_message(delivery("t", "retry", "r1")))
    assert runner.sessions.read("t").version == 0


def test_a_reply_that_cannot_fit_is_an_error_at_once_and_the_state_is_kept(
    runner: AgentRunner, transport: InMemoryTransport, agent: Remembering
) -> None:
    run(runner.process_message(delivery("b", "first", "r1")))
    run(runner.process_message(delivery("b", "BIG", "r2")))  # no exception: not retried
    run(runner.process_message(delivery("b", "BIG", "r2", attempt=2)))  # a stray redelivery
    run(runner.process_message(delivery("b", "third", "r3")))
    assert agent.runs == ["first", "BIG", "third"]
    sent = replies(transport)
    assert [(r["status"], r.get("error")) for r in sent] == [
        ("200", None),
        ("500", "REPLY_TOO_LARGE"),
        ("200", None),
    ]
    assert sent[-1]["result"] == '["first", "third"]'


def test_permanent_failure_of_a_committed_turn_resends_its_reply(
    runner: AgentRunner, transport: InMemoryTransport
) -> None:
    run(runner.process_message(delivery("p", "done", "r1", attempt=3)))
    run(runner.on_permanent_failure(delivery("p", "done", "r1", attempt=4)))
    assert [r.get("result") for r in replies(transport)] == ['["done"]']


def test_permanent_failure_logs_one_line_and_is_committed(
    runner: AgentRunner, transport: InMemoryTransport, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(RetryableError):
        run(runner.process_message(delivery("f", "retry", "r1", attempt=3)))
    with caplog.at_level("ERROR", logger="agentkernel.pipeline.runner.agent_runner"):
        run(runner.on_permanent_failure(delivery("f", "retry", "r1", attempt=4)))
    [line] = [r.getMessage() for r in caplog.records]
    assert "r1" in line and "session f" in line and "3 attempts" in line
    assert "RetryableError: try again" in line
    run(runner.on_permanent_failure(delivery("f", "retry", "r1", attempt=5)))
    assert [r["error"] for r in replies(transport)] == ["TURN_FAILED"]
    assert runner.sessions.read("f").last.status_code == 500  # type: ignore[union-attr]


def test_a_turn_that_never_ran_alone_gets_its_run_instead_of_failing(
    runner: AgentRunner, transport: InMemoryTransport, agent: Remembering
) -> None:
    """Its deliveries went to crashes of a poison turn beside it: it is run, not failed."""
    run(runner.on_permanent_failure(delivery("h", "held", "r1", attempt=4)))
    assert agent.runs == ["held"]
    assert [r["result"] for r in replies(transport)] == ['["held"]']


def test_a_turn_that_fails_its_late_run_is_still_answered(
    runner: AgentRunner, transport: InMemoryTransport, agent: Remembering
) -> None:
    run(runner.on_permanent_failure(delivery("h", "retry", "r1", attempt=4)))
    assert agent.runs == ["retry"]
    assert [r["error"] for r in replies(transport)] == ["TURN_FAILED"]


# -- on a real broker -----------------------------------------------------------------------------


@pytest.mark.nats
def test_a_2_mb_reply_on_nats_is_answered_reply_too_large_once(nats_url: str) -> None:
    """The observed case: a reply over NATS's 1 MB message limit was retried, and each retry
    added the turn to the session state again. Now: one run, one error reply, state untouched."""
    from agentkernel.pipeline.transport.nats import NatsTransport
    from agentkernel.pipeline.transport.sync_face import SyncTransport
    from tests.transports.test_nats import settings

    transport = NatsTransport(settings(nats_url), {QueueName.INPUT: 10, QueueName.OUTPUT: 10})
    agent, sessions = Remembering(), InMemorySessionStore()
    registry = AgentRegistry()
    runner = AgentRunner(
        config_with(RunnerConfig()), registry, transport=transport, sessions=sessions
    )

    async def big(turn: Turn) -> str:
        agent.runs.append(turn.prompt)
        turn.state.setdefault("seen", []).append(turn.prompt)
        return "x" * 2_000_000 if turn.prompt == "BIG" else json.dumps(turn.state["seen"])

    registry.register(Agent("remember", big))
    try:
        run(runner.process_message(delivery("n", "first", "r1")))
        run(runner.process_message(delivery("n", "BIG", "r2")))  # no exception: not retried
        run(runner.process_message(delivery("n", "BIG", "r2", attempt=2)))
        run(runner.process_message(delivery("n", "third", "r3")))
        consumer = SyncTransport(transport).create_consumer(QueueName.OUTPUT)
        got = []
        while batch := consumer.fetch(10, 2):
            for message in batch:
                consumer.ack(message)
                got.append(json.loads(message.body))
        consumer.close()
    finally:
        transport.close()
    assert agent.runs == ["first", "BIG", "third"]
    assert [g.get("error") for g in got] == [None, "REPLY_TOO_LARGE", None]
    assert sessions.load("n") == {"seen": ["first", "third"]}
