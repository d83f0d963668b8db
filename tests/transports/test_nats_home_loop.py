"""A consumer loop over NATS fetches, handles and settles on the connection's own event loop."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.transport.nats import NatsTransport
from agentkernel.pipeline.transport.nats.changes import Changes
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.transports.nats_sync import nats

pytestmark = pytest.mark.nats


def settings(url: str) -> NatsQueueConfig:
    tag = uuid.uuid4().hex[:10].upper()
    return NatsQueueConfig.model_validate(
        {
            "url": url,
            "input_stream": f"IN_{tag}",
            "input_subject_prefix": f"h{tag}.in",
            "output_stream": f"OUT_{tag}",
            "output_subject_prefix": f"h{tag}.out",
            "partitions": 4,
            "ack_wait": 2.0,
            "retry_backoff": 0,
            "auto_provision": True,
        }
    )


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    NatsTransport.reset()


@pytest.fixture
def transport(nats_url: str) -> SyncTransport:
    return nats(settings(nats_url))


def input_loop(transport: SyncTransport, process: Any, **settings: Any) -> ConsumerLoop:
    """A consumer loop on the INPUT queue with short fetch waits; ``settings`` override."""
    options: dict[str, Any] = {
        "on_permanent_failure": lambda m: None,
        "wait_seconds": 0.2,
        "stop": threading.Event(),
    } | settings
    return ConsumerLoop.from_handlers(
        process=process,
        consumer_factory=lambda: transport.create_consumer(QueueName.INPUT),
        **options,
    )


def run_until(loop: ConsumerLoop, done: Callable[[], bool], timeout: float = 10.0) -> None:
    """Run ``loop`` on a thread until ``done()`` (or the timeout), then stop it."""
    thread = threading.Thread(target=loop.run, kwargs={"exit_on_shutdown": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        loop.stop()
        thread.join(10)
    assert not thread.is_alive()


def wait_depth(transport: SyncTransport, depth: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while (now := transport.depth(QueueName.INPUT)) != depth and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def test_messages_are_handled_and_acked_on_the_connection_loop(transport: SyncTransport) -> None:
    home = transport.conn.loop.loop
    seen: list[tuple[str, bool]] = []

    async def process(message: QueueMessage) -> None:
        seen.append((message.body, asyncio.get_running_loop() is home))

    for i in range(6):
        transport.send(QueueName.INPUT, QueueMessage(body=f"m{i}", group_id=f"s{i % 3}"))
    loop = input_loop(transport, process)
    run_until(loop, lambda: len(seen) == 6)
    assert sorted(seen) == [(f"m{i}", True) for i in range(6)]
    assert wait_depth(transport, 0) == 0


def test_a_failure_is_given_back_and_a_permanent_one_terminated_from_the_loop(
    transport: SyncTransport,
) -> None:
    deliveries: list[int] = []
    hooked: list[int] = []

    async def process(message: QueueMessage) -> None:
        deliveries.append(message.receive_count)
        raise RuntimeError("fails every time")

    transport.send(QueueName.INPUT, QueueMessage(body="poison", group_id="g"))
    loop = input_loop(
        transport,
        process,
        on_permanent_failure=lambda m: hooked.append(m.receive_count),
        max_receive_count=2,
        retry_backoff=0.05,
    )
    run_until(loop, lambda: bool(hooked))
    assert deliveries == [1, 2] and hooked == [3]  # nacked twice, then terminated
    assert wait_depth(transport, 0) == 0


def test_a_stopping_loop_lets_the_turn_on_the_connection_loop_finish(
    transport: SyncTransport,
) -> None:
    started, finished = threading.Event(), threading.Event()

    async def process(message: QueueMessage) -> None:
        started.set()
        await asyncio.sleep(0.5)
        finished.set()

    transport.send(QueueName.INPUT, QueueMessage(body="slow", group_id="g"))
    loop = input_loop(transport, process, drain_timeout=5.0)
    run_until(loop, started.is_set)  # stopped while the turn runs
    assert finished.is_set()
    assert wait_depth(transport, 0) == 0


def test_changes_wake_a_waiter_or_let_it_time_out() -> None:
    async def scenario() -> tuple[float, float, bool]:
        changes = Changes(asyncio.get_running_loop())
        began = time.monotonic()
        await changes.wait(0.05)  # nobody sets it
        timed_out = time.monotonic() - began
        asyncio.get_running_loop().call_later(0.02, changes.set)
        began = time.monotonic()
        await changes.wait(5.0)
        woken = time.monotonic() - began
        return timed_out, woken, changes.is_set()

    timed_out, woken, is_set = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert 0.04 <= timed_out < 1.0 and woken < 1.0 and is_set
