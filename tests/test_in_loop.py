"""InLoopConsumer (the message handling on an event loop) and the broker it relies on."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from agentkernel.pipeline.consumer.handling import HandlingPolicy, MessageHandling
from agentkernel.pipeline.consumer.in_loop import InLoopConsumer
from agentkernel.pipeline.transport.in_memory import InMemoryTransport, ManualClock
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

WAIT = 5.0  # bound of every wait in these tests; none is expected to take it


def send(transport: InMemoryTransport, body: str, group: str = "g") -> None:
    transport.send(QueueName.INPUT, QueueMessage(body=body, group_id=group))


def in_loop(
    transport: InMemoryTransport, process, hook=None, max_in_flight: int = 64, **kw
) -> InLoopConsumer:
    async def no_hook(message: QueueMessage) -> None:
        return None

    policy = {k: v for k, v in kw.items() if k != "drain_timeout"}
    handling = MessageHandling(
        process,
        hook or no_hook,
        queue=QueueName.INPUT,
        policy=HandlingPolicy(retry_backoff=0.01, **policy),
    )
    return InLoopConsumer(
        handling,
        lambda: transport.create_consumer(QueueName.INPUT),
        max_in_flight=max_in_flight,
        drain_timeout=kw.get("drain_timeout", 2.0),
        name="input",
    )


async def until(predicate) -> None:
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.005)


async def stopped(consumer: InLoopConsumer, task: asyncio.Task[None]) -> None:
    consumer.stop()
    async with asyncio.timeout(WAIT):
        await task
    assert consumer.wait_stopped(0)


def test_handles_each_message_once_and_acks_it() -> None:
    transport = InMemoryTransport()
    seen: list[str] = []

    async def process(message: QueueMessage) -> None:
        seen.append(message.body)

    async def main() -> None:
        consumer = in_loop(transport, process)
        task = consumer.start()
        for i in range(20):
            send(transport, str(i), group=f"g{i % 3}")
        await until(lambda: len(seen) == 20)
        await until(lambda: transport.in_flight(QueueName.INPUT) == 0)
        await stopped(consumer, task)

    asyncio.run(main())
    assert sorted(seen, key=int) == [str(i) for i in range(20)]
    assert transport.depth(QueueName.INPUT) == 0
    assert transport.open_consumers(QueueName.INPUT) == 0


def test_keeps_one_message_per_group_in_flight_and_the_group_order() -> None:
    transport = InMemoryTransport()
    order: dict[str, list[int]] = defaultdict(list)
    running: dict[str, int] = defaultdict(int)
    overlap: list[str] = []

    async def process(message: QueueMessage) -> None:
        group = message.group_id or ""
        running[group] += 1
        if running[group] > 1:
            overlap.append(group)
        await asyncio.sleep(0)
        order[group].append(int(message.body))
        running[group] -= 1

    async def main() -> None:
        consumer = in_loop(transport, process)
        task = consumer.start()
        for i in range(30):
            send(transport, str(i), group=f"g{i % 2}")
        await until(lambda: sum(map(len, order.values())) == 30)
        await stopped(consumer, task)

    asyncio.run(main())
    assert not overlap
    assert order["g0"] == list(range(0, 30, 2))
    assert order["g1"] == list(range(1, 30, 2))


def test_never_runs_more_than_max_in_flight() -> None:
    transport = InMemoryTransport()
    running, most, done = 0, 0, 0

    async def process(message: QueueMessage) -> None:
        nonlocal running, most, done
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        done += 1

    async def main() -> None:
        consumer = in_loop(transport, process, max_in_flight=3)
        task = consumer.start()
        for i in range(12):
            send(transport, str(i), group=f"g{i}")
        await until(lambda: done == 12)
        await stopped(consumer, task)

    asyncio.run(main())
    assert most == 3


def test_a_failure_is_redelivered_then_answered_by_the_permanent_failure_hook() -> None:
    transport = InMemoryTransport()
    deliveries: list[int] = []
    answered: list[int] = []

    async def process(message: QueueMessage) -> None:
        deliveries.append(message.receive_count)
        raise RuntimeError("agent down")

    async def hook(message: QueueMessage) -> None:
        answered.append(message.receive_count)

    async def main() -> None:
        consumer = in_loop(transport, process, hook, max_receive_count=2)
        task = consumer.start()
        send(transport, "x")
        await until(lambda: answered)
        await until(lambda: transport.in_flight(QueueName.INPUT) == 0)
        await stopped(consumer, task)

    asyncio.run(main())
    assert deliveries == [1, 2]
    assert answered == [3]
    assert transport.depth(QueueName.INPUT) == 0


def test_stop_hands_back_what_did_not_finish_within_the_drain() -> None:
    transport = InMemoryTransport()
    started = asyncio.Event()

    async def process(message: QueueMessage) -> None:
        started.set()
        await asyncio.sleep(3600)

    async def main() -> None:
        consumer = in_loop(transport, process, drain_timeout=0.05)
        task = consumer.start()
        send(transport, "stuck")
        async with asyncio.timeout(WAIT):
            await started.wait()
        await stopped(consumer, task)

    asyncio.run(main())
    assert transport.in_flight(QueueName.INPUT) == 0
    assert transport.depth(QueueName.INPUT) == 1  # back on the queue for the next consumer


def test_wait_ready_wakes_on_a_send_from_another_thread() -> None:
    transport = InMemoryTransport()
    consumer = transport.create_consumer(QueueName.INPUT)

    async def main() -> list[QueueMessage]:
        waiting = asyncio.ensure_future(consumer.wait_ready(WAIT))
        await asyncio.sleep(0)
        await asyncio.to_thread(send, transport, "hello")
        async with asyncio.timeout(WAIT):
            await waiting
        return consumer.fetch(10, 0)

    assert [m.body for m in asyncio.run(main())] == ["hello"]


def test_wait_ready_returns_for_a_lease_that_ran_out() -> None:
    clock = ManualClock()
    transport = InMemoryTransport(ack_wait=5.0, clock=clock)
    consumer = transport.create_consumer(QueueName.INPUT)
    send(transport, "m")
    assert consumer.fetch(1, 0)
    clock.advance(6.0)

    async def main() -> list[QueueMessage]:
        async with asyncio.timeout(WAIT):
            await consumer.wait_ready(3600)
        return consumer.fetch(1, 0)

    [again] = asyncio.run(main())
    assert again.receive_count == 2


@pytest.mark.parametrize("leases", [1, 200])
def test_leases_expire_in_deadline_order_whatever_their_number(leases: int) -> None:
    clock = ManualClock()
    transport = InMemoryTransport(ack_wait=10.0, clock=clock)
    consumer = transport.create_consumer(QueueName.INPUT)
    for i in range(leases):
        send(transport, str(i), group=f"g{i}")
        assert consumer.fetch(1, 0)
        clock.advance(0.01)
    clock.advance(10.0 - 0.01 * leases + 0.005)  # only the first lease has run out
    [first] = consumer.fetch(leases, 0)
    assert first.body == "0" and first.receive_count == 2


# -- hand_over: a message handled in its sender's task instead of sent --------------------------


def handing(transport: InMemoryTransport, record, process=None) -> InLoopConsumer:
    """An in-loop consumer of OUTPUT (no leases, as the response handler's has none) whose
    handling processes a message handed over with ``record``, a plain call, and a fetched one
    with ``process`` (default: ``record`` too)."""

    async def fetched(message: QueueMessage) -> None:
        record(message)

    handling = MessageHandling(
        process or fetched,
        process or fetched,
        queue=QueueName.OUTPUT,
        policy=HandlingPolicy(lease_extension=False),
        process_now=record,
    )
    return InLoopConsumer(
        handling,
        lambda: transport.create_consumer(QueueName.OUTPUT),
        max_in_flight=8,
        name="output",
    )


def reply(body: str, group: str = "s", dedup: str | None = None) -> QueueMessage:
    return QueueMessage(body=body, group_id=group, dedup_id=dedup or f"{body}:reply")


def test_a_message_handed_over_is_handled_in_the_callers_task_and_never_queued() -> None:
    transport = InMemoryTransport()
    seen: list[tuple[str, asyncio.Task | None]] = []

    def record(message: QueueMessage) -> None:
        seen.append((message.body, asyncio.current_task()))

    async def main() -> None:
        consumer = handing(transport, record)
        task = consumer.start()
        await asyncio.sleep(0)  # the consumer opens its queue
        assert consumer.hand_over(reply("r1"))
        assert seen == [("r1", asyncio.current_task())]
        # the same dedup id again (a replayed reply): dropped, as a send would drop it
        assert consumer.hand_over(reply("r1"))
        transport.send(QueueName.OUTPUT, reply("r1"))
        await asyncio.sleep(0.05)
        await stopped(consumer, task)

    asyncio.run(main())
    assert [body for body, _ in seen] == ["r1"]
    assert transport.depth(QueueName.OUTPUT) == 0
    assert transport.in_flight(QueueName.OUTPUT) == 0


def test_a_message_is_not_taken_while_its_group_has_one_queued_or_in_flight() -> None:
    transport = InMemoryTransport()
    order: list[str] = []

    async def main() -> None:
        gate = asyncio.Event()

        def record(message: QueueMessage) -> None:
            order.append(message.body)

        async def process(message: QueueMessage) -> None:
            if message.body == "chunk":
                await gate.wait()
            record(message)

        consumer = handing(transport, record, process)
        task = consumer.start()
        await asyncio.sleep(0)
        transport.send(QueueName.OUTPUT, reply("chunk"))  # fetched, then held in its handling
        await until(lambda: transport.in_flight(QueueName.OUTPUT) == 1)
        transport.send(QueueName.OUTPUT, reply("queued"))  # waits behind it
        # a final reply of that group must not overtake either of them
        assert not consumer.hand_over(reply("final"))
        # another group is free: taken at once
        assert consumer.hand_over(reply("other", group="t"))
        transport.send(QueueName.OUTPUT, reply("final"))  # what the sender does next
        gate.set()
        await until(lambda: len(order) == 4)
        await stopped(consumer, task)

    asyncio.run(main())
    assert order == ["other", "chunk", "queued", "final"]


def test_a_message_whose_handling_fails_is_given_back_and_its_send_delivered() -> None:
    transport = InMemoryTransport()
    calls: list[str] = []

    def record(message: QueueMessage) -> None:
        calls.append(message.body)
        if len(calls) == 1:
            raise RuntimeError("the store said no")

    async def main() -> None:
        consumer = handing(transport, record)
        task = consumer.start()
        await asyncio.sleep(0)
        assert not consumer.hand_over(reply("r1"))
        # its dedup id was given back: the send that follows is not taken for a duplicate
        assert transport.send(QueueName.OUTPUT, reply("r1")) is not None
        await until(lambda: len(calls) == 2)
        await until(lambda: transport.in_flight(QueueName.OUTPUT) == 0)
        await stopped(consumer, task)

    asyncio.run(main())
    assert calls == ["r1", "r1"]


def test_nothing_is_handed_over_before_the_consumer_runs_or_once_it_stops() -> None:
    transport = InMemoryTransport()
    seen: list[str] = []

    async def main() -> None:
        consumer = handing(transport, lambda message: seen.append(message.body))
        assert not consumer.hand_over(reply("early"))
        task = consumer.start()
        await asyncio.sleep(0)
        consumer.stop()
        assert not consumer.hand_over(reply("late"))
        async with asyncio.timeout(WAIT):
            await task

    asyncio.run(main())
    assert seen == []


def test_a_handling_that_may_yield_takes_nothing_handed_over() -> None:
    """Handled in one call that never yields, a message handed over cannot be overtaken by a
    message of its group, cut by a drain or lost to a cancellation half-way; a handling with
    only an async ``process`` (which may yield) takes nothing, and every message is sent."""
    transport = InMemoryTransport()
    seen: list[str] = []

    async def process(message: QueueMessage) -> None:
        await asyncio.sleep(0)
        seen.append(message.body)

    async def main() -> None:
        handling = MessageHandling(
            process, process, queue=QueueName.OUTPUT, policy=HandlingPolicy(lease_extension=False)
        )
        assert not handling.processes_unqueued
        with pytest.raises(RuntimeError, match="cannot process a message unqueued"):
            handling.process_unqueued(reply("r0"))
        consumer = InLoopConsumer(
            handling,
            lambda: transport.create_consumer(QueueName.OUTPUT),
            max_in_flight=8,
            name="output",
        )
        task = consumer.start()
        await asyncio.sleep(0)
        assert not consumer.hand_over(reply("r1"))
        # not claimed either: the send that follows is not taken for a duplicate
        assert transport.send(QueueName.OUTPUT, reply("r1")) is not None
        await until(lambda: seen == ["r1"])
        await stopped(consumer, task)

    asyncio.run(main())
