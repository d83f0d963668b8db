"""A failure that would repeat on every attempt is answered at once, with its cause; a turn that
used up its deliveries is answered with the cause of its last failure.

Runs the Agent Runner's message path against each session store (in memory, Redis, DynamoDB on
moto), with the in-memory transport carrying the replies.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import pytest

from agentkernel import Agent, AgentRegistry, RetryableError, Turn
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.runner.last_errors import MAX_CAUSE, cause_of
from agentkernel.pipeline.session_store import SessionStore
from agentkernel.pipeline.session_store.dynamodb import DynamoDBSessionStore
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from tests.runner_config import config_with
from tests.stores.test_response_stores import create_table
from tests.test_turn_outcomes import delivery, replies, run

SECRET = "hunter2"


@pytest.fixture(params=["in_memory", "redis", "dynamodb"])
def sessions(request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    if request.param == "in_memory":
        yield InMemorySessionStore()
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
        yield RedisSessionStore(url, prefix=f"t:{uuid.uuid4().hex}:")
    else:
        request.getfixturevalue("aws")
        yield DynamoDBSessionStore(new_table())


def new_table() -> str:
    table = f"sessions-{uuid.uuid4().hex[:8]}"
    create_table(table, "session_id")
    return table


class Stateful:
    """An agent that leaves in the state whatever its prompt asks for, counting its runs."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    async def __call__(self, turn: Turn) -> str:
        self.runs.append(turn.prompt)
        if turn.prompt == "datetime":
            turn.state["when"] = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        elif turn.prompt == "huge":
            turn.state["blob"] = "x" * 5_000_000
        elif turn.prompt == "retry":
            raise RetryableError(f"model at redis://:{SECRET}@cache:6379/0 said " + "no " * 500)
        else:
            turn.state.setdefault("seen", []).append(turn.prompt)
        return "ok"


def runner_for(sessions: SessionStore, agent: Stateful) -> tuple[AgentRunner, InMemoryTransport]:
    registry = AgentRegistry()
    registry.register(Agent("stateful", agent))
    transport = InMemoryTransport()
    config = config_with(RunnerConfig())
    return AgentRunner(config, registry, transport=transport, sessions=sessions), transport


def test_a_state_that_is_not_json_is_answered_at_once_with_its_cause(
    sessions: SessionStore,
) -> None:
    agent = Stateful()
    runner, transport = runner_for(sessions, agent)
    run(runner.process_message(delivery("d", "first", "r1")))
    run(runner.process_message(delivery("d", "datetime", "r2")))  # no exception: not retried
    run(runner.process_message(delivery("d", "datetime", "r2", attempt=2)))  # a stray copy
    run(runner.process_message(delivery("d", "third", "r3")))
    assert agent.runs == ["first", "datetime", "third"]
    sent = replies(transport)
    assert [(r["status"], r.get("error")) for r in sent] == [
        ("200", None),
        ("500", "STATE_NOT_STORED"),
        ("200", None),
    ]
    assert "datetime" in sent[1]["message"] and "stateful" in sent[1]["message"]
    assert sessions.load("d") == {"seen": ["first", "third"]}


@pytest.mark.aws
def test_a_state_too_large_for_dynamodb_is_answered_at_once_with_its_cause(aws: str) -> None:
    """The observed case: a 5 MB state ran 3 times and the caller got only TURN_FAILED."""
    store, agent = DynamoDBSessionStore(new_table()), Stateful()
    runner, transport = runner_for(store, agent)
    run(runner.process_message(delivery("h", "huge", "r1")))  # no exception: not retried
    run(runner.process_message(delivery("h", "after", "r2")))
    assert agent.runs == ["huge", "after"]
    sent = replies(transport)
    assert [(r["status"], r.get("error")) for r in sent] == [
        ("500", "STATE_NOT_STORED"),
        ("200", None),
    ]
    assert "400 KB" in sent[0]["message"]
    assert store.load("h") == {"seen": ["after"]}


def test_turn_failed_names_the_last_error_without_its_secrets(sessions: SessionStore) -> None:
    agent = Stateful()
    runner, transport = runner_for(sessions, agent)
    with pytest.raises(RetryableError):
        run(runner.process_message(delivery("f", "retry", "r1", attempt=3)))
    run(runner.on_permanent_failure(delivery("f", "retry", "r1", attempt=4)))
    [reply] = replies(transport)
    assert reply["error"] == "TURN_FAILED"
    assert "3 attempts" in reply["message"]
    assert "RetryableError: model at redis://:***@cache:6379/0 said no" in reply["message"]
    assert SECRET not in reply["message"]
    assert len(reply["message"]) < MAX_CAUSE + 100


def test_turn_failed_says_when_this_process_did_not_see_the_failure(
    sessions: SessionStore,
) -> None:
    """A crash, a lost lease or another replica: the cause is not known here, and it says so."""
    agent = Stateful()
    runner, transport = runner_for(sessions, agent)
    runner.sessions.save("g", {})
    record = runner.sessions.read("g")
    # The turn's run alone has started (its trial) elsewhere, and that process died.
    runner.sessions.write("g", record.on_trial("r1"), expected_version=record.version)
    run(runner.on_permanent_failure(delivery("g", "retry", "r1", attempt=4)))
    [reply] = replies(transport)
    assert reply["error"] == "TURN_FAILED"
    assert "not seen by this process" in reply["message"]
    assert agent.runs == []


def test_an_agent_error_message_is_bounded_and_redacted(sessions: SessionStore) -> None:
    async def leaky(turn: Turn) -> str:
        raise ValueError(f"cannot reach nats://user:{SECRET}@broker:4222 " + "x" * 10_000)

    registry = AgentRegistry()
    registry.register(Agent("leaky", leaky))
    transport = InMemoryTransport()
    runner = AgentRunner(
        config_with(RunnerConfig()), registry, transport=transport, sessions=sessions
    )
    run(runner.process_message(delivery("a", "hi", "r1")))
    [reply] = replies(transport)
    assert reply["error"] == "AGENT_ERROR"
    assert "ValueError: cannot reach nats://user:***@broker:4222" in reply["message"]
    assert SECRET not in reply["message"]
    assert len(reply["message"]) < MAX_CAUSE + 100


def test_cause_of_is_one_bounded_printable_line() -> None:
    cause = cause_of(RuntimeError("line one\nline two\x1b[31m " + "y" * 5000))
    assert cause.startswith("RuntimeError: line one\\nline two\\x1b[31m")
    assert len(cause) <= MAX_CAUSE and cause.endswith("...")
    assert cause_of(KeyError()) == "KeyError"
