"""Hostile or malformed queue messages: a clear outcome, nothing lost, nothing crashes."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.core.config.queues import QueuesConfig
from agentkernel.pipeline.response_store.handler import ResponseHandler, record_of
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.runner_config import config_with


@pytest.fixture
def transport() -> InMemoryTransport:
    return InMemoryTransport()


@pytest.fixture
def runner(transport: InMemoryTransport) -> AgentRunner:
    registry = AgentRegistry()
    registry.register(Agent("echo", lambda turn: turn.prompt))
    return AgentRunner(
        config_with(RunnerConfig()), registry, transport=transport, sessions=InMemorySessionStore()
    )


def replies(transport: InMemoryTransport) -> list[QueueMessage]:
    return transport.create_consumer(QueueName.OUTPUT).fetch(10, 0.05)


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        "",
        "[1, 2, 3]",
        '"a string"',
        "null",
        '{"prompt": "no session"}',
        '{"session_id": "s"}',
        '{"session_id": "", "prompt": "x"}',
        '{"session_id": 5, "prompt": "x"}',
        '{"session_id": "s", "prompt": {"nested": true}}',
        "[" * 5000 + "]" * 5000,
        '{"session_id": "s", "prompt": "\\ud800"}',
    ],
)
def test_bad_input_bodies_get_a_400_reply(
    transport: InMemoryTransport, runner: AgentRunner, body: str
) -> None:
    message = QueueMessage(body=body, attributes={"request_id": "r1"}, group_id="g")
    asyncio.run(runner.process_message(message))
    [reply] = replies(transport)
    assert reply.attributes["status_code"] == "400"
    doc = json.loads(reply.body)
    assert (doc["error"], doc["request_id"]) == ("INVALID_REQUEST", "r1")


def test_an_input_message_without_request_id_is_dropped(
    transport: InMemoryTransport, runner: AgentRunner
) -> None:
    body = json.dumps({"session_id": "s", "prompt": "x"})
    asyncio.run(runner.process_message(QueueMessage(body=body, group_id="s")))
    assert replies(transport) == []  # nobody could read a reply; nothing else breaks


def test_an_oversized_prompt_is_run_and_answered(
    transport: InMemoryTransport, runner: AgentRunner
) -> None:
    body = json.dumps({"session_id": "s", "prompt": "p" * 500_000})
    message = QueueMessage(body=body, attributes={"request_id": "r"}, group_id="s")
    asyncio.run(runner.process_message(message))
    [reply] = replies(transport)
    assert json.loads(reply.body)["result"] == "p" * 500_000


def test_unknown_agent_on_the_queue_is_a_404_reply(
    transport: InMemoryTransport, runner: AgentRunner
) -> None:
    body = json.dumps({"session_id": "s", "prompt": "x", "agent": "ghost"})
    message = QueueMessage(body=body, attributes={"request_id": "r"}, group_id="s")
    asyncio.run(runner.process_message(message))
    [reply] = replies(transport)
    assert reply.attributes["status_code"] == "404"


def test_extra_attributes_do_not_leak_into_the_reply(
    transport: InMemoryTransport, runner: AgentRunner
) -> None:
    body = json.dumps({"session_id": "s", "prompt": "x"})
    attrs = {"request_id": "r", "status_code": "200", "evil": "x" * 1000, "user_id": "u"}
    asyncio.run(runner.process_message(QueueMessage(body=body, attributes=attrs, group_id="s")))
    [reply] = replies(transport)
    assert set(reply.attributes) == {"request_id", "status_code", "user_id"}


@pytest.mark.parametrize("group", ["other-session", None])
def test_a_body_naming_another_session_than_its_group_is_refused(
    transport: InMemoryTransport, runner: AgentRunner, group: str | None
) -> None:
    """The session is the message's group (its ordering key); the body must not redirect it."""
    body = json.dumps({"session_id": "victim", "prompt": "x"})
    message = QueueMessage(body=body, attributes={"request_id": "r"}, group_id=group)
    asyncio.run(runner.process_message(message))
    [reply] = replies(transport)
    assert reply.attributes["status_code"] == "400"
    assert json.loads(reply.body)["error"] == "SESSION_MISMATCH"
    assert runner.sessions.read("victim").version == 0  # the turn never ran in "victim"


def test_an_owned_turn_runs_under_its_scoped_group_and_no_other_identitys(
    transport: InMemoryTransport, runner: AgentRunner
) -> None:
    """With an owner, the group is the session's scoped key: the body names the session the
    client chose, and a group scoped to another identity is refused like any other mismatch."""
    from agentkernel.pipeline.wire.scoping import session_key

    body = json.dumps({"session_id": "s1", "prompt": "x", "agent": "echo"})
    mine = session_key("s1", "key:alice")
    for rid, group in (("r1", mine), ("r2", session_key("s1", "key:bob"))):
        attributes = {"request_id": rid, "user_id": "key:alice"}
        message = QueueMessage(body=body, attributes=attributes, group_id=group)
        asyncio.run(runner.process_message(message))
    first, second = replies(transport)
    assert json.loads(first.body).get("error") != "SESSION_MISMATCH"
    assert json.loads(second.body)["error"] == "SESSION_MISMATCH"


@pytest.mark.parametrize("queue", list(QueueName))
def test_an_undecodable_message_is_answered_and_dead_lettered_once(
    transport: InMemoryTransport, runner: AgentRunner, queue: QueueName
) -> None:
    store = InMemoryResponseStore()
    handler = ResponseHandler(transport, store, QueuesConfig())
    handling = runner.handling() if queue == QueueName.INPUT else handler.handling()
    foreign = QueueMessage(
        attributes={"request_id": "r"}, group_id="s", undecodable="body is not UTF-8"
    )
    transport.send(queue, foreign)
    consumer = transport.create_consumer(queue)
    [message] = consumer.fetch(1, 1.0)
    asyncio.run(handling.begin(consumer, message))
    handling.close()
    if queue == QueueName.INPUT:
        [reply] = replies(transport)
        assert json.loads(reply.body)["error"] == "UNDECODABLE_MESSAGE"
    else:
        record = store.get("r")
        assert record is not None and record.status_code == 500
    assert transport.depth(queue) == 0 and transport.in_flight(queue) == 0


@pytest.mark.parametrize(
    ("body", "attributes"),
    [
        ("{}", {}),  # no request id
        ("not json", {"request_id": "r"}),
        ("[1]", {"request_id": "r"}),
        ("[" * 5000 + "]" * 5000, {"request_id": "r"}),
    ],
)
def test_malformed_output_messages_are_refused_for_retry(
    body: str, attributes: dict[str, str]
) -> None:
    with pytest.raises((ValueError, RecursionError)):
        record_of(QueueMessage(body=body, attributes=attributes))


def test_an_unparseable_status_code_is_treated_as_200() -> None:
    record = record_of(
        QueueMessage(
            body='{"session_id": "s"}', attributes={"request_id": "r", "status_code": "abc"}
        )
    )
    assert (record.status_code, record.session_id) == (200, "s")


def test_a_failing_output_message_still_answers_the_caller(transport: InMemoryTransport) -> None:
    store = InMemoryResponseStore()
    handler = ResponseHandler(transport, store, QueuesConfig())
    poison = QueueMessage(
        body="not json", attributes={"request_id": "r"}, group_id="s", receive_count=4
    )
    handler.on_permanent_failure(poison)
    record = store.get("r")
    assert record is not None and (record.status_code, record.session_id) == (500, "s")


def test_components_use_the_empty_stores_they_are_given(transport: InMemoryTransport) -> None:
    """Regression: empty in-memory stores are falsy (``__len__``) and were once replaced."""
    from agentkernel.core.config.root import AKConfig
    from agentkernel.pipeline.process.io_handler import IOHandler

    store, sessions = InMemoryResponseStore(), InMemorySessionStore()
    handler = IOHandler(
        AKConfig.load(), AgentRegistry(), transport=transport, store=store, with_runner=False
    )
    assert handler.store is store
    runner = AgentRunner(
        config_with(RunnerConfig()), AgentRegistry(), transport=transport, sessions=sessions
    )
    assert runner.sessions is sessions
