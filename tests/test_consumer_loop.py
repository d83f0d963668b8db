"""ConsumerLoop semantics over the in-memory transport."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import defaultdict

import pytest

from agentkernel.core.errors import (
    AKConfigError,
    SessionStoreUnavailableError,
    StoreUnavailableError,
    TransportError,
)
from agentkernel.pipeline.consumer import outage
from agentkernel.pipeline.consumer.in_flight import Slots
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


def send(transport: InMemoryTransport, body: str, group: str = "g") -> None:
    transport.send(QueueName.INPUT, QueueMessage(body=body, group_id=group))


class Runner:
    """Runs a loop on a thread and stops it when the test is done."""

    def __init__(self, loop: ConsumerLoop) -> None:
        self.loop = loop
        self.thread = threading.Thread(target=loop.run, daemon=True)

    def __enter__(self) -> ConsumerLoop:
        self.thread.start()
        return self.loop

    def __exit__(self, *exc: object) -> None:
        self.loop.stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "consumer loop did not stop"


def make_loop(transport: InMemoryTransport, process, hook=lambda m: None, **kw) -> ConsumerLoop:
    kw.setdefault("wait_seconds", 0.2)
    kw.setdefault("retry_backoff", 0.01)
    kw.setdefault("consumer_factory", lambda: transport.create_consumer(QueueName.INPUT))
    return ConsumerLoop.from_handlers(
        process=process,
        on_permanent_failure=hook,
        queue=QueueName.INPUT,
        **kw,
    )


def wait_until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_processes_and_acks() -> None:
    transport = InMemoryTransport()
    seen: list[str] = []
    send(transport, "hello")
    with Runner(make_loop(transport, lambda m: seen.append(m.body))):
        wait_until(lambda: seen == ["hello"])
    assert transport.create_consumer(QueueName.INPUT).fetch(1, 0.05) == []


def test_a_raising_process_is_retried_then_sent_to_the_hook() -> None:
    transport = InMemoryTransport()
    deliveries: list[int] = []
    failed: list[int] = []

    def process(m: QueueMessage) -> None:
        deliveries.append(m.receive_count)
        raise RuntimeError("boom")

    send(transport, "poison")
    with Runner(make_loop(transport, process, lambda m: failed.append(m.receive_count))):
        wait_until(lambda: failed == [4])
    assert deliveries == [1, 2, 3]
    assert transport.depth(QueueName.INPUT) == 0
    assert transport.create_consumer(QueueName.INPUT).fetch(1, 0.05) == []


def test_a_raising_hook_leaves_the_message_queued() -> None:
    transport = InMemoryTransport()
    calls: list[int] = []

    def hook(m: QueueMessage) -> None:
        calls.append(m.receive_count)
        if len(calls) == 1:
            raise RuntimeError("store down")

    send(transport, "poison")
    loop = make_loop(transport, lambda m: 1 / 0, hook, max_receive_count=1)
    with Runner(loop):
        wait_until(lambda: len(calls) == 2)
    assert calls == [2, 3]


def test_async_process_keeps_many_messages_in_flight_on_one_thread() -> None:
    transport = InMemoryTransport()
    active = 0
    peak = 0
    done: list[str] = []

    async def process(m: QueueMessage) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.3)
        active -= 1
        done.append(m.body)

    for i in range(60):
        send(transport, str(i), group=f"s{i}")
    started = time.monotonic()
    with Runner(make_loop(transport, process, num_consumers=1, batch_size=10, max_in_flight=100)):
        wait_until(lambda: len(done) == 60)
    assert time.monotonic() - started < 3.0
    assert peak >= 50


def test_max_in_flight_is_a_ceiling() -> None:
    transport = InMemoryTransport()
    active = 0
    peak = 0
    done = 0

    async def process(m: QueueMessage) -> None:
        nonlocal active, peak, done
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        done += 1

    for i in range(40):
        send(transport, str(i), group=f"s{i}")
    with Runner(make_loop(transport, process, num_consumers=3, batch_size=5, max_in_flight=7)):
        wait_until(lambda: done == 40)
    assert 1 < peak <= 7


def test_per_group_order_is_exact_with_many_in_flight() -> None:
    transport = InMemoryTransport()
    seen: dict[str, list[int]] = defaultdict(list)

    async def process(m: QueueMessage) -> None:
        await asyncio.sleep(0.001 * (hash(m.body) % 5))
        seen[m.group_id or ""].append(int(m.body))

    for i in range(30):
        for group in ("a", "b", "c"):
            send(transport, str(i), group=group)
    with Runner(make_loop(transport, process, num_consumers=2, batch_size=4)):
        wait_until(lambda: sum(map(len, seen.values())) == 90)
    assert dict(seen) == {g: list(range(30)) for g in ("a", "b", "c")}


def test_fetch_errors_back_off_and_retry() -> None:
    transport = InMemoryTransport()
    seen: list[str] = []
    failures = [RuntimeError("broker away")]

    class Flaky(TransportConsumer):
        def __init__(self) -> None:
            self.inner = transport.create_consumer(QueueName.INPUT)

        def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
            if failures:
                raise failures.pop()
            return self.inner.fetch(batch_size, wait_seconds)

        def ack(self, message: QueueMessage) -> None:
            self.inner.ack(message)

    loop = ConsumerLoop.from_handlers(
        process=lambda m: seen.append(m.body),
        on_permanent_failure=lambda m: None,
        consumer_factory=Flaky,
        wait_seconds=0.2,
    )
    loop._error_backoff = 0.2
    send(transport, "after-error")
    with Runner(loop):
        wait_until(lambda: seen == ["after-error"])


@pytest.mark.parametrize("is_async", [False, True])
def test_stop_drains_the_message_in_hand(is_async: bool) -> None:
    transport = InMemoryTransport()
    started = threading.Event()
    finished: list[str] = []

    def work(m: QueueMessage) -> None:
        started.set()
        time.sleep(0.5)
        finished.append(m.body)

    async def awork(m: QueueMessage) -> None:
        await asyncio.to_thread(work, m)

    send(transport, "in-hand")
    loop = make_loop(transport, awork if is_async else work)
    runner = Runner(loop)
    with runner:
        assert started.wait(5)
    assert finished == ["in-hand"]  # __exit__ joined only after the turn completed
    assert transport.create_consumer(QueueName.INPUT).fetch(1, 0.05) == []
    assert transport.open_consumers(QueueName.INPUT) == 1  # only the one just created


@pytest.mark.parametrize("extend", [True, False])
def test_lease_extension_prevents_a_second_delivery(extend: bool) -> None:
    transport = InMemoryTransport(ack_wait=0.3)
    deliveries: list[int] = []

    async def slow(m: QueueMessage) -> None:
        deliveries.append(m.receive_count)
        await asyncio.sleep(1.0)

    send(transport, "long")
    loop = make_loop(transport, slow, lease_extension=extend, num_consumers=2)
    with Runner(loop):
        time.sleep(1.3)
    assert (deliveries == [1]) is extend


def test_invalid_sizes_are_rejected() -> None:
    with pytest.raises(ValueError):
        ConsumerLoop.from_handlers(
            process=print,
            on_permanent_failure=print,
            consumer_factory=lambda: None,
            num_consumers=0,
        )  # type: ignore[arg-type,return-value]


class BatchingConsumer(TransportConsumer):
    """Hands out all queued messages of a group in one fetch, as SQS FIFO batches may."""

    def __init__(self, messages: list[QueueMessage]) -> None:
        self.messages = messages
        self.acked: list[str] = []

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        batch, self.messages = self.messages[:batch_size], self.messages[batch_size:]
        if not batch:
            time.sleep(min(wait_seconds, 0.05))
        return batch

    def ack(self, message: QueueMessage) -> None:
        self.acked.append(message.body)


def test_messages_of_one_group_in_one_batch_run_one_by_one() -> None:
    consumer = BatchingConsumer(
        [QueueMessage(body=str(i), group_id="g" if i % 2 else "h") for i in range(10)]
    )
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)

    async def process(m: QueueMessage) -> None:
        start = time.monotonic()
        await asyncio.sleep(0.05)
        spans[m.group_id or ""].append((start, time.monotonic()))

    loop = ConsumerLoop.from_handlers(
        process=process,
        on_permanent_failure=lambda m: None,
        consumer_factory=lambda: consumer,
        batch_size=10,
        wait_seconds=0.1,
    )
    with Runner(loop):
        wait_until(lambda: len(consumer.acked) == 10)
    for group in ("g", "h"):
        runs = spans[group]
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(runs))
    assert [b for b in consumer.acked if int(b) % 2] == ["1", "3", "5", "7", "9"]


@pytest.mark.parametrize(("declared", "expected"), [(None, 1.0), (20.0, 20.0), (0.25, 0.25)])
def test_fetch_waits_are_sliced_to_the_consumer_declaration(
    declared: float | None, expected: float
) -> None:
    waits: list[float] = []

    class Recording(TransportConsumer):
        fetch_wait_slice_seconds = declared

        def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
            waits.append(wait_seconds)
            time.sleep(0.01)
            return []

        def ack(self, message: QueueMessage) -> None:
            pass

    loop = ConsumerLoop.from_handlers(
        process=print,
        on_permanent_failure=print,
        consumer_factory=Recording,
        wait_seconds=20.0,
    )
    with Runner(loop):
        wait_until(lambda: len(waits) >= 2)
    assert set(waits) == {expected}


# -- failures and shutdown ---------------------------------------------------------------------


class Delegating(TransportConsumer):
    """An in-memory consumer without a delayed nack, like a broker that cannot delay one."""

    def __init__(self, transport: InMemoryTransport) -> None:
        self.inner = transport.create_consumer(QueueName.INPUT)

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        return self.inner.fetch(batch_size, wait_seconds)

    def ack(self, message: QueueMessage) -> None:
        self.inner.ack(message)

    def nack(self, message: QueueMessage) -> None:
        self.inner.nack(message)

    def close(self) -> None:
        self.inner.close()


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.mark.parametrize(("is_async", "native"), [(False, True), (True, True), (False, False)])
def test_failed_message_is_redelivered_after_a_doubling_delay(is_async: bool, native: bool) -> None:
    transport = InMemoryTransport()
    seen: list[float] = []

    def fail(m: QueueMessage) -> None:
        seen.append(time.monotonic())
        raise RuntimeError("store down")

    async def afail(m: QueueMessage) -> None:
        fail(m)

    send(transport, "reply")
    loop = make_loop(
        transport,
        afail if is_async else fail,
        max_receive_count=10,
        retry_backoff=0.2,
        consumer_factory=(lambda: transport.create_consumer(QueueName.INPUT))
        if native
        else (lambda: Delegating(transport)),
    )
    with Runner(loop):
        wait_until(lambda: len(seen) >= 4)
    # Before the back-off a failed message came back at once (276 times in 0.3 s on Redis).
    assert [round(g, 1) >= d for g, d in zip(gaps(seen), (0.2, 0.4, 0.8), strict=False)] == [
        True,
        True,
        True,
    ], gaps(seen)


def test_a_held_message_does_not_block_other_messages_of_a_sync_loop() -> None:
    transport = InMemoryTransport()
    done: list[str] = []

    def process(m: QueueMessage) -> None:
        if m.body == "bad":
            raise RuntimeError("fails")
        done.append(m.body)

    send(transport, "bad", group="a")
    for i in range(3):
        send(transport, f"ok{i}", group="b")
    loop = make_loop(
        transport,
        process,
        retry_backoff=10.0,
        consumer_factory=lambda: Delegating(transport),
        num_consumers=1,
    )
    started = time.monotonic()
    with Runner(loop):
        wait_until(lambda: len(done) == 3)
        assert time.monotonic() - started < 3.0
    # stop() hands the held message back at once instead of waiting out its 10 s delay
    assert time.monotonic() - started < 5.0
    assert [m.body for m in transport.create_consumer(QueueName.INPUT).fetch(5, 0.5)] == ["bad"]


def test_repeated_failures_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    transport = InMemoryTransport()
    attempts: list[int] = []

    def fail(m: QueueMessage) -> None:
        attempts.append(m.receive_count)
        raise TransportError("store down")

    for i in range(40):
        send(transport, str(i), group=f"g{i}")
    caplog.set_level(logging.WARNING, logger="agentkernel.pipeline.consumer.handling")
    with Runner(make_loop(transport, fail, retry_backoff=0, max_receive_count=100)):
        wait_until(lambda: len(attempts) >= 200)
    lines = [r for r in caplog.records if r.name == "agentkernel.pipeline.consumer.handling"]
    assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]  # first one, then a summary
    assert "more like it" in lines[-1].getMessage()


def test_a_consumer_that_fails_to_start_is_created_again() -> None:
    transport = InMemoryTransport()
    seen: list[str] = []
    failures = [TransportError("broker away"), OSError("refused")]

    def factory() -> TransportConsumer:
        if failures:
            raise failures.pop()
        return transport.create_consumer(QueueName.INPUT)

    send(transport, "after-restart")
    loop = make_loop(transport, lambda m: seen.append(m.body), consumer_factory=factory)
    loop._consumer_retry = 0.05
    with Runner(loop):
        wait_until(lambda: seen == ["after-restart"])


def test_stop_returns_while_a_consumer_keeps_failing_to_start() -> None:
    def factory() -> TransportConsumer:
        raise TransportError("broker away")

    loop = make_loop(InMemoryTransport(), print, consumer_factory=factory)
    thread = threading.Thread(target=loop.consume, daemon=True)
    thread.start()
    time.sleep(0.3)
    loop.stop()
    assert loop.wait_stopped(3.0)  # before the fix, wait_stopped never returned
    thread.join(3)


def test_a_configuration_error_at_start_is_raised_and_still_stops_the_loop() -> None:
    def factory() -> TransportConsumer:
        raise AKConfigError("execution.queues.nats: stream AGENT_REQUESTS does not exist")

    loop = make_loop(InMemoryTransport(), print, consumer_factory=factory)
    with pytest.raises(AKConfigError):
        loop.consume()
    assert loop.wait_stopped(0)


@pytest.mark.parametrize(("threads", "stop_timeout"), [(1, None), (5, 0.0)])
def test_drain_is_bounded_and_hands_back_what_did_not_finish(
    caplog: pytest.LogCaptureFixture, threads: int, stop_timeout: float | None
) -> None:
    transport = InMemoryTransport()
    started = threading.Event()

    async def stuck(m: QueueMessage) -> None:
        started.set()
        await asyncio.sleep(60)

    transport.send(
        QueueName.INPUT, QueueMessage(body="x", group_id="g", attributes={"request_id": "r-77"})
    )
    loop = make_loop(transport, stuck, drain_timeout=0.3, num_consumers=threads)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    assert started.wait(5)
    stopped_at = time.monotonic()
    loop.stop(stop_timeout)  # 0: hand back at once, while sibling threads may still fetch
    assert loop.wait_stopped(5)
    assert time.monotonic() - stopped_at < 2.0
    thread.join(5)
    again = transport.create_consumer(QueueName.INPUT).fetch(1, 0.5)
    # handed back once, not left to its lease, and not bounced between sibling threads that
    # were still fetching (each bounce cost a delivery: a turn ended TURN_FAILED unrun)
    assert [m.receive_count for m in again] == [2]
    assert sum("r-77" in r.getMessage() for r in caplog.records) == 1


def test_stop_with_a_drain_timeout_overrides_the_loops_own() -> None:
    transport = InMemoryTransport()
    started = threading.Event()

    async def stuck(m: QueueMessage) -> None:
        started.set()
        await asyncio.sleep(60)

    send(transport, "x")
    loop = make_loop(transport, stuck, drain_timeout=60)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    assert started.wait(5)
    loop.stop(drain_timeout=0.1)
    assert loop.wait_stopped(3)
    thread.join(5)


def test_run_closes_the_given_clients_in_order_after_the_drain() -> None:
    transport = InMemoryTransport()
    closed: list[str] = []
    done: list[str] = []
    send(transport, "x")
    loop = make_loop(transport, lambda m: done.append(m.body))
    thread = threading.Thread(
        target=loop.run,
        kwargs={"close": [lambda: closed.append("transport"), lambda: closed.append("store")]},
        daemon=True,
    )
    thread.start()
    wait_until(lambda: done == ["x"])
    assert closed == []
    loop.stop()
    thread.join(5)
    assert closed == ["transport", "store"]


def test_retry_delay_doubles_per_delivery_up_to_the_cap() -> None:
    from agentkernel.core.log_limit import RateLimitedLog
    from agentkernel.pipeline.transport.redelivery import Redelivery

    redelivery = Redelivery(
        "q",
        base=0.5,
        cap=30.0,
        stopping=lambda: False,
        release=lambda m: None,
        log=RateLimitedLog(logging.getLogger("test")),
    )
    delays = [redelivery.delay(QueueMessage(receive_count=n)) for n in range(1, 10)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert redelivery.delay(QueueMessage(receive_count=10_000)) == 30.0  # no overflow


@pytest.fixture
def quick_outage_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outage, "OUTAGE_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(outage, "MAX_OUTAGE_RETRY_SECONDS", 0.02)


@pytest.mark.usefixtures("quick_outage_retries")
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_store_outage_does_not_spend_deliveries(is_async: bool) -> None:
    """More failed tries than ``max_receive_count``, all on the first delivery, then it works."""
    transport = InMemoryTransport()
    tries: list[int] = []
    failed: list[int] = []

    def process(m: QueueMessage) -> None:
        tries.append(m.receive_count)
        if len(tries) <= 6:
            raise SessionStoreUnavailableError("Redis read of session g failed: refused")

    async def aprocess(m: QueueMessage) -> None:
        process(m)

    send(transport, "turn")
    loop = make_loop(transport, aprocess if is_async else process, lambda m: failed.append(1))
    with Runner(loop):
        wait_until(lambda: len(tries) == 7)
        wait_until(lambda: transport.in_flight(QueueName.INPUT) == 0)
    assert tries == [1] * 7
    assert failed == []
    assert transport.depth(QueueName.INPUT) == 0


@pytest.mark.usefixtures("quick_outage_retries")
def test_the_permanent_failure_hook_waits_out_a_store_outage_on_its_delivery() -> None:
    """On SQS the next receive would move the message to the DLQ with its caller unanswered."""
    transport = InMemoryTransport()
    hooked: list[int] = []

    def hook(m: QueueMessage) -> None:
        hooked.append(m.receive_count)
        if len(hooked) <= 4:
            raise StoreUnavailableError("Redis write failed: refused")

    send(transport, "turn")
    with Runner(make_loop(transport, lambda m: 1 / 0, hook, max_receive_count=1)):
        wait_until(lambda: len(hooked) == 5)
        wait_until(lambda: transport.in_flight(QueueName.INPUT) == 0)
    assert hooked == [2] * 5
    assert transport.depth(QueueName.INPUT) == 0


def test_a_stopping_loop_hands_back_a_message_waiting_out_an_outage() -> None:
    transport = InMemoryTransport()
    tries: list[int] = []

    async def process(m: QueueMessage) -> None:
        tries.append(m.receive_count)
        raise StoreUnavailableError("Redis write failed: refused")

    send(transport, "turn")
    runner = Runner(make_loop(transport, process, drain_timeout=5.0))
    with runner:
        wait_until(lambda: tries == [1])
        started = time.monotonic()
    assert time.monotonic() - started < 2.0  # the 0.5 s wait ends at once on stop
    assert tries == [1]
    (again,) = transport.create_consumer(QueueName.INPUT).fetch(1, 1.0)
    assert again.receive_count == 2


def test_a_stopping_loop_hands_a_failed_message_back_once_its_fetches_ended() -> None:
    """Handed back at once, the message would be taken again by the fetch still waiting when
    the loop stopped, and run again: one of its deliveries spent on the shutdown."""
    transport = InMemoryTransport()
    tries: list[int] = []
    loop: ConsumerLoop

    async def process(m: QueueMessage) -> None:
        tries.append(m.receive_count)
        while not loop.stopping():  # fails the moment the loop stops
            await asyncio.sleep(0.005)
        raise RuntimeError("cancelled by the shutdown")

    send(transport, "turn")
    loop = make_loop(transport, process, retry_backoff=0.0, drain_timeout=5.0)
    with Runner(loop):
        wait_until(lambda: tries == [1])
        time.sleep(0.1)  # the consumer thread waits in its next fetch
        started = time.monotonic()
    assert time.monotonic() - started < 2.0  # the fetch's slice, not the drain's 5 s
    assert tries == [1]
    (again,) = transport.create_consumer(QueueName.INPUT).fetch(1, 1.0)
    assert again.receive_count == 2


class LateArrivals(TransportConsumer):
    """Fetches nothing; when fetching stops, hands over what arrived after the last fetch."""

    def __init__(self, late: list[QueueMessage]) -> None:
        self.late = late
        self.acked: list[str] = []
        self.nacked: list[str] = []

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        time.sleep(min(wait_seconds, 0.01))
        return []

    def ack(self, message: QueueMessage) -> None:
        self.acked.append(message.body)

    def nack(self, message: QueueMessage) -> None:
        self.nacked.append(message.body)

    def stop_fetching(self) -> list[QueueMessage]:
        late, self.late = self.late, []
        return late


def test_what_arrives_after_the_last_fetch_runs_in_the_drain() -> None:
    """Handing it back instead would cost it a delivery, on every rolling deploy."""
    consumer = LateArrivals([QueueMessage(body="late", group_id="g", message_id="m1")])
    ran: list[str] = []
    loop = ConsumerLoop.from_handlers(
        process=lambda m: ran.append(m.body),
        on_permanent_failure=print,
        consumer_factory=lambda: consumer,
        wait_seconds=0.05,
    )
    with Runner(loop):
        time.sleep(0.1)
    assert ran == ["late"]
    assert (consumer.acked, consumer.nacked) == (["late"], [])


def test_a_place_is_freed_once_however_many_threads_release_it() -> None:
    slots = Slots(3)
    assert slots.take(3, 0.0) == 3
    places = [slots.place() for _ in range(2)]
    start = threading.Barrier(8)

    def release_both() -> None:
        start.wait(5)
        for release in places:
            release()

    threads = [threading.Thread(target=release_both) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert slots.take(3, 0.0) == 2  # two places freed, each once; the third is still taken


def test_a_place_given_back_on_a_thread_wakes_a_waiting_event_loop() -> None:
    slots = Slots(1)
    assert slots.take(1, 0.0) == 1

    async def wait_for_room() -> float:
        began = time.monotonic()
        threading.Timer(0.05, slots.give).start()
        await slots.wait_async(5.0)
        return time.monotonic() - began

    assert asyncio.run(asyncio.wait_for(wait_for_room(), 10)) < 2.0
    assert slots.take(1, 0.0) == 1
