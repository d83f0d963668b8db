"""A turn delivered again is recognised by its broker position, past the 64-id window."""

from __future__ import annotations

import asyncio
import json

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store.base import REMEMBERED_TURNS, SessionRecord, TurnOutcome
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.position import Position
from tests.runner_config import config_with
from tests.test_turn_outcomes import Remembering, delivery

UNIT = "kafka:in[0]@id-1"


def at(session: str, n: int, unit: str = UNIT, attempt: int = 1):  # type: ignore[no-untyped-def]
    message = delivery(session, f"p{n}", f"r{n}", attempt)
    return message.model_copy(update={"position": Position(unit, 100 + n)})


def runner_with(agent: Remembering) -> AgentRunner:
    registry = AgentRegistry()
    registry.register(Agent("remember", agent))
    config = config_with(RunnerConfig())
    return AgentRunner(
        config, registry, transport=InMemoryTransport(), sessions=InMemorySessionStore()
    )


def play(runner: AgentRunner, messages: list) -> None:  # type: ignore[type-arg]
    for message in messages:
        asyncio.run(runner.process_message(message))


def test_a_replay_older_than_the_id_window_is_not_run_again() -> None:
    agent, turns = Remembering(), REMEMBERED_TURNS + 6
    runner = runner_with(agent)
    play(runner, [at("s", n) for n in range(turns)])
    play(runner, [at("s", n, attempt=2) for n in range(turns)])  # the whole replay
    assert len(agent.runs) == turns
    assert runner.sessions.load("s")["seen"] == [f"p{n}" for n in range(turns)]


def test_the_last_allowed_delivery_of_a_replay_is_not_failed() -> None:
    agent = Remembering()
    runner = runner_with(agent)
    play(runner, [at("s", n) for n in range(REMEMBERED_TURNS + 2)])
    before = runner.sessions.read("s")
    asyncio.run(runner.on_permanent_failure(at("s", 0, attempt=4)))
    assert runner.sessions.read("s") == before  # no TURN_FAILED committed over an applied turn


def test_a_position_of_another_unit_falls_back_to_the_id_window() -> None:
    agent = Remembering()
    runner = runner_with(agent)
    play(runner, [at("s", n) for n in range(3)])
    play(runner, [at("s", 1, unit="kafka:in[5]@id-1")])  # the id is remembered: not run
    play(runner, [at("s", 9, unit="kafka:in[5]@id-1")])  # a new turn on a moved partition
    assert agent.runs == ["p0", "p1", "p2", "p9"]
    assert runner.sessions.read("s").applied == Position("kafka:in[5]@id-1", 109)


def test_a_record_of_format_1_decodes_without_a_position() -> None:
    old = {"state": {"n": 1}, "turns": ["r1"], "last": None}
    record = SessionRecord.decode(json.dumps(old), 3)
    assert (record.applied, record.committed, record.version) == (None, ("r1",), 3)
    assert not record.has_applied("r0", Position(UNIT, 1))


def test_the_applied_position_survives_encoding_and_moves_forward_only() -> None:
    outcome = TurnOutcome("r1", 200, "{}")
    record = SessionRecord().advance(outcome, {}, Position(UNIT, 7))
    again = SessionRecord.decode(record.encode(), record.version)
    assert again.applied == Position(UNIT, 7)
    assert json.loads(record.encode())["format"] == 2
    assert again.advance(outcome, None).applied == Position(UNIT, 7)  # no position: kept
    assert again.advance(outcome, None, Position(UNIT, 5)).applied == Position(UNIT, 7)
    assert again.has_applied("other", Position(UNIT, 7))
    assert not again.has_applied("other", Position(UNIT, 8))
