"""Per-turn deadlines, JSON replies, and the warning for agents that block the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import Any

import pytest

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.runtime.event_loop import LoopThread, StallWatchdog
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, QueueMessage, QueueName
from tests.runner_config import config_with


async def sleepy(turn):  # type: ignore[no-untyped-def]
    await asyncio.sleep(float(turn.extra.get("seconds", 5)))
    turn.state["slept"] = True
    return "woke"


async def structured(turn):  # type: ignore[no-untyped-def]
    return {"answer": 42, "items": ["a", "ü"]}


async def own_timeout(turn):  # type: ignore[no-untyped-def]
    raise TimeoutError("the model timed out")


def make_runner(turn_timeout: float | None = None) -> tuple[AgentRunner, InMemoryTransport]:
    transport = InMemoryTransport()
    registry = AgentRegistry()
    registry.register(Agent("sleepy", sleepy))
    registry.register(Agent("quick", sleepy, timeout=0.2))
    registry.register(Agent("structured", structured))
    registry.register(Agent("own", own_timeout))
    runner = AgentRunner(
        config_with(RunnerConfig(turn_timeout=turn_timeout)),
        registry,
        transport=transport,
        sessions=InMemorySessionStore(),
    )
    return runner, transport


def turn(agent: str, session: str = "s", **extra: Any) -> QueueMessage:
    body = {"session_id": session, "prompt": "p", "agent": agent, **extra}
    return QueueMessage(
        body=json.dumps(body), attributes={ATTR_REQUEST_ID: f"r-{agent}"}, group_id=session
    )


def reply(transport: InMemoryTransport) -> tuple[str, dict[str, Any]]:
    [message] = transport.create_consumer(QueueName.OUTPUT).fetch(1, 1)
    return message.attributes["status_code"], json.loads(message.body)


def test_a_turn_past_the_configured_deadline_is_cancelled_and_answered_504() -> None:
    runner, transport = make_runner(turn_timeout=0.3)
    started = time.monotonic()
    asyncio.run(runner.process_message(turn("sleepy")))
    assert time.monotonic() - started < 2
    status, doc = reply(transport)
    assert (status, doc["error"]) == ("504", "TURN_TIMEOUT")
    assert runner.sessions.load("s") == {}  # the cancelled turn left no state
    asyncio.run(runner.process_message(turn("sleepy", seconds=0.01)))  # committed: not rerun
    assert runner.sessions.load("s") == {}


def test_an_agent_timeout_overrides_the_default() -> None:
    runner, transport = make_runner(turn_timeout=None)
    asyncio.run(runner.process_message(turn("quick")))
    assert reply(transport)[1]["error"] == "TURN_TIMEOUT"
    with pytest.raises(ValueError, match="positive"):
        Agent("bad", sleepy, timeout=0)


def test_a_timeout_error_raised_by_the_agent_is_an_agent_error() -> None:
    runner, transport = make_runner(turn_timeout=10)
    asyncio.run(runner.process_message(turn("own")))
    assert reply(transport)[1]["error"] == "AGENT_ERROR"


async def stubborn(turn):  # type: ignore[no-untyped-def]
    """Catches its cancellation and runs on, as an agent with a bare ``except`` around an await
    does (or one whose ``asyncio.wait_for`` dropped the cancellation, on Python 3.11)."""
    for _ in range(4):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1.0)
    turn.state["late"] = True
    return "too late"


async def stubborn_stream(turn):  # type: ignore[no-untyped-def]
    yield "early "
    for word in ("late ", "later"):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1.0)
        yield word


def test_an_agent_that_ignores_its_cancellation_is_answered_504_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the deadline waited for the agent to end on its own (4 s here, for ever for an
    agent that never ends), holding its session."""
    runner, transport = make_runner()
    runner.registry.register(Agent("stubborn", stubborn, timeout=0.3))

    async def main() -> float:
        started = time.monotonic()
        await runner.process_message(turn("stubborn"))
        answered = time.monotonic() - started
        await asyncio.sleep(4.5)  # the agent runs on to its end, left alone
        return answered

    with caplog.at_level(logging.ERROR, logger="agentkernel.pipeline.runner.execution"):
        answered = asyncio.run(main())
    assert answered < 2.5  # the deadline, then a second to unwind
    status, doc = reply(transport)
    assert (status, doc["error"]) == ("504", "TURN_TIMEOUT")
    assert runner.sessions.load("s") == {}  # what it did after its turn ended is not kept
    assert "caught the cancellation" in caplog.text


def test_a_streaming_agent_that_ignores_its_cancellation_sends_no_chunk_after_its_reply() -> None:
    runner, transport = make_runner()
    runner.registry.register(Agent("stubborn_stream", stubborn_stream, timeout=0.3))
    message = turn("stubborn_stream", stream=True)

    async def main() -> None:
        await runner.process_message(message)
        await asyncio.sleep(2.5)  # past the agent's next yields

    asyncio.run(main())
    consumer, sent = transport.create_consumer(QueueName.OUTPUT), []
    while batch := consumer.fetch(10, 0.2):  # one message of the session at a time
        sent += batch
        for message in batch:
            consumer.ack(message)
    chunks = [json.loads(m.body) for m in sent if "chunk_index" in m.attributes]
    assert [c["delta"] for c in chunks] == ["early "]
    assert sent[-1].attributes["status_code"] == "504"


def test_dicts_and_lists_are_answered_as_json() -> None:
    runner, transport = make_runner()
    asyncio.run(runner.process_message(turn("structured")))
    assert json.loads(reply(transport)[1]["result"]) == {"answer": 42, "items": ["a", "ü"]}


def test_a_blocked_event_loop_is_reported_with_the_agent_and_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from agentkernel import Turn

    loop = LoopThread("stall-test", stall_warning=0.1)

    async def blocking_agent(turn: Turn) -> None:
        time.sleep(0.5)  # the mistake the watchdog is there to catch

    with caplog.at_level(logging.WARNING, logger="agentkernel.pipeline.runtime.event_loop"):
        loop.run(blocking_agent(Turn("p", "s", "req-blocking", "blocker")), timeout=5)
        deadline = time.monotonic() + 3
        while len(caplog.records) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    loop.stop()
    first = caplog.records[0].getMessage()
    assert "agent blocker" in first and "req-blocking" in first and "test_turn_limits.py" in first
    assert "blocked for 0." in caplog.records[1].getMessage()


def test_a_busy_but_yielding_loop_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    before = threading.active_count()  # other tests' threads may still be ending meanwhile
    loop = LoopThread("calm-test", stall_warning=0.1)

    async def polite() -> None:
        for _ in range(20):
            await asyncio.sleep(0.02)

    with caplog.at_level(logging.WARNING, logger="agentkernel.pipeline.runtime.event_loop"):
        loop.run(polite(), timeout=5)
    loop.stop()
    assert caplog.records == []
    assert threading.active_count() <= before  # the loop's thread and its watchdog are gone


def test_a_loop_waiting_for_io_is_not_mistaken_for_a_blocked_one() -> None:
    # A loop that is late only because the machine did not schedule its thread sits in the
    # selector's wait: that is not an agent blocking it, so no warning names one.
    loop = LoopThread("idle-test")
    blocked = threading.Event()

    async def block() -> None:
        blocked.set()
        time.sleep(0.5)

    try:
        watchdog = StallWatchdog(loop.loop, loop._thread, 0.1)
        time.sleep(0.1)
        assert watchdog._idle()
        loop.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(block()))
        assert blocked.wait(5)
        assert not watchdog._idle()
    finally:
        loop.stop()
