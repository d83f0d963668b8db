"""How many turns the embedded runner keeps in flight by default, and what each one costs.

On the in-memory transport no turn holds a broker lease, so the default cap on turns in flight
is far above a broker runner's 256: 1,000 sessions of slow turns all run at once, as they would
behind a plain FastAPI endpoint. What bounds them then is memory, measured here per turn.
"""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc

from agentkernel import Agent, AgentRegistry, Turn
from agentkernel.core.config.execution import (
    BROKER_MAX_IN_FLIGHT,
    IN_PROCESS_MAX_IN_FLIGHT,
    RunnerConfig,
)
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.consumer.in_loop import InLoopConsumer
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

from .runner_config import config_with

WAIT = 30.0  # bound of every wait here; a healthy run takes well under a second per wait
TURNS = 1000
QUIET = 1.0  # seconds with no further turn started that mean a cap holds the rest back
#: Memory one turn in flight may take, queued message, task, session and reply included. The
#: measured figure is 10-12 KB alone; tracemalloc counts every thread's allocations, and in a
#: full test run other tests' background threads (store listeners, sweepers) added up to 5 KB
#: per turn, so the bound is twice the figure: a turn that grew by half again still fails.
MAX_BYTES_PER_TURN = 24 * 1024


class Gate:
    """An agent that holds every turn until released, counting the turns it holds."""

    def __init__(self) -> None:
        self.running = 0
        self.open = asyncio.Event()

    async def run(self, turn: Turn) -> str:
        self.running += 1
        await self.open.wait()
        return "done"


async def until(predicate) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.01)


async def started(gate: Gate) -> None:
    """Until every turn runs, or no further turn started for QUIET seconds (a cap held).

    The quiet count starts at the first turn that runs, never before: the turns start as tasks
    on one loop, taking their steps in turn, so none reaches the agent until nearly all do. On
    a loaded machine that took 0.7 s, which a count started at zero read as a cap of none.
    """
    loop = asyncio.get_running_loop()
    seen, quiet_since = 0, loop.time()
    async with asyncio.timeout(WAIT):
        while gate.running < TURNS:
            now = loop.time()
            if gate.running != seen:
                seen, quiet_since = gate.running, now
            elif seen and now - quiet_since > QUIET:
                return
            await asyncio.sleep(0.01)


async def send_turns(transport: QueueTransport, count: int) -> None:
    for i in range(count):
        body = json.dumps({"session_id": f"s{i}", "prompt": "x", "agent": "gate"})
        message = QueueMessage(body=body, group_id=f"s{i}", attributes={"request_id": f"r{i}"})
        await transport.send(QueueName.INPUT, message)


async def hold_turns(handler: IOHandler, gate: Gate) -> tuple[int, int]:
    """Start the handler's in-loop consumers, queue TURNS turns and wait until no more start,
    then let every turn finish. Returns the turns that ran at once and the bytes allocated
    meanwhile (tracemalloc)."""
    consumers = [handler.runner_loop, handler.output_loop]
    assert all(isinstance(c, InLoopConsumer) for c in consumers)
    for consumer in consumers:
        consumer.start()  # type: ignore[union-attr]
    await asyncio.sleep(0.1)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    await send_turns(handler.transport, TURNS)
    await started(gate)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    at_once = gate.running
    gate.open.set()
    await until(lambda: all(handler.store.get(f"r{i}") is not None for i in range(TURNS)))
    for consumer in consumers:
        consumer.stop()  # type: ignore[union-attr]
        await until(lambda c=consumer: c.wait_stopped(0))  # type: ignore[union-attr,misc]
    return at_once, held


def test_the_embedded_runner_runs_a_thousand_slow_turns_at_once_at_the_defaults() -> None:
    gate = Gate()
    registry = AgentRegistry()
    registry.register(Agent("gate", gate.run))
    handler = IOHandler(AKConfig.load(), registry=registry, with_runner=True)
    tracemalloc.start()
    try:
        at_once, held = asyncio.run(hold_turns(handler, gate))
    finally:
        tracemalloc.stop()
        for close in handler._owned:
            close()
    assert at_once == TURNS  # none waited for another's turn to end
    assert held / TURNS < MAX_BYTES_PER_TURN, f"{held / TURNS:.0f} bytes per turn in flight"


def test_an_unset_cap_follows_where_the_queues_live_and_a_set_one_wins() -> None:
    assert RunnerConfig().in_flight_limit(queues_in_process=True) == IN_PROCESS_MAX_IN_FLIGHT
    assert RunnerConfig().in_flight_limit(queues_in_process=False) == BROKER_MAX_IN_FLIGHT == 256
    for in_process in (True, False):
        assert RunnerConfig(max_in_flight=7).in_flight_limit(in_process) == 7


def test_a_runner_on_a_broker_keeps_the_broker_default() -> None:
    class BrokerLike(InMemoryTransport):
        queues_in_process = False  # as every broker transport declares

    runner = AgentRunner(
        config_with(RunnerConfig()),
        AgentRegistry(),
        transport=BrokerLike(),
        sessions=InMemorySessionStore(),
    )
    assert runner.consumer_loop().settings.max_in_flight == BROKER_MAX_IN_FLIGHT
    embedded = AgentRunner(
        config_with(RunnerConfig()),
        AgentRegistry(),
        transport=InMemoryTransport(),
        sessions=InMemorySessionStore(),
    )
    assert embedded.consumer_loop().settings.max_in_flight == IN_PROCESS_MAX_IN_FLIGHT
