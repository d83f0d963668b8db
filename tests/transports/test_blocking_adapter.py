"""The adapter that puts blocking and upstream-style consumers behind the async API, attacked
one step off the guide: shared consumers, odd return values, mixed plain and async methods, a
fetch that ignores its wait, and the sync face called where it would wait on itself."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import pytest

from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer
from agentkernel.pipeline.transport.blocking import adapt_consumer
from agentkernel.pipeline.transport.sync_face import SyncConsumer
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


class Queue:
    """Messages handed out once each, and what became of them."""

    def __init__(self, n: int) -> None:
        self.lock = threading.Lock()
        self.waiting = deque(QueueMessage(body=f"m{i}", message_id=f"m{i}") for i in range(n))
        self.acks: Counter[str] = Counter()
        self.nacks: Counter[str] = Counter()
        self.dead: Counter[str] = Counter()
        self.processed: Counter[str] = Counter()

    def take(self, n: int) -> list[QueueMessage]:
        with self.lock:
            return [self.waiting.popleft() for _ in range(min(n, len(self.waiting)))]


class Plain(TransportConsumer):
    """Written to upstream's guide: plain methods over a :class:`Queue`."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:  # type: ignore[override]
        got = self.queue.take(batch_size)
        if not got:
            time.sleep(min(wait_seconds, 0.05))
        return got

    def ack(self, message: QueueMessage) -> None:  # type: ignore[override]
        self.queue.acks[str(message.message_id)] += 1

    def nack(self, message: QueueMessage) -> None:  # type: ignore[override]
        self.queue.nacks[str(message.message_id)] += 1


def run_loop(
    factory: Callable[[], Any],
    queue: Queue,
    done: Callable[[], bool],
    process: Callable[[QueueMessage], Any] | None = None,
    **settings: Any,
) -> float:
    """Run a loop until ``done()`` (10 s at most); returns how long its stop took."""

    def count(message: QueueMessage) -> None:
        queue.processed[str(message.message_id)] += 1

    options: dict[str, Any] = {"wait_seconds": 0.5, "drain_timeout": 2.0} | settings
    loop = ConsumerLoop.from_handlers(
        process=process or count,
        on_permanent_failure=lambda m: None,
        consumer_factory=factory,
        stop=threading.Event(),
        **options,
    )
    thread = threading.Thread(target=loop.run, kwargs={"exit_on_shutdown": False}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    began = time.monotonic()
    loop.stop()
    thread.join(30)
    assert not thread.is_alive()
    return time.monotonic() - began


def test_one_face_shared_by_two_consumer_threads_hands_each_message_out_once() -> None:
    queue = Queue(20)
    face = SyncConsumer(Plain(queue))  # the factory returns the same object to both threads
    run_loop(lambda: face, queue, lambda: sum(queue.acks.values()) >= 20, num_consumers=2)
    assert sum(queue.processed.values()) == 20 and set(queue.processed.values()) == {1}
    assert sum(queue.acks.values()) == 20


def test_a_fetch_that_returns_none_counts_as_nothing_fetched() -> None:
    queue = Queue(2)

    class ReturnsNone(Plain):
        def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:  # type: ignore[override]
            got = self.queue.take(batch_size)
            if got:
                return got
            time.sleep(0.05)
            return None  # type: ignore[return-value]  # a bare return on an empty queue

    run_loop(lambda: ReturnsNone(queue), queue, lambda: sum(queue.acks.values()) == 2)
    assert sum(queue.acks.values()) == 2
    assert not ThreadRunner.shutdown_event.is_set()  # no consumer thread crashed


def test_plain_and_async_methods_mixed_are_each_called_as_written() -> None:
    queue = Queue(3)

    class Mixed(Plain):
        async def ack(self, message: QueueMessage) -> None:  # type: ignore[override]
            self.queue.acks[str(message.message_id)] += 1

        async def dead_letter(self, message: QueueMessage) -> None:
            self.queue.dead[str(message.message_id)] += 1

    queue.waiting[2] = QueueMessage(body="m2", message_id="m2", receive_count=9)  # poison
    assert type(adapt_consumer(Mixed(queue))).__name__ == "AdaptedConsumer"
    run_loop(lambda: Mixed(queue), queue, lambda: len(queue.acks) + len(queue.dead) == 3)
    assert dict(queue.acks) == {"m0": 1, "m1": 1}
    assert dict(queue.dead) == {"m2": 1}  # its own dead_letter, not the default ack


def test_a_fetch_that_ignores_its_wait_does_not_hold_the_stop_and_its_message_goes_back() -> None:
    queue = Queue(1)
    release = threading.Event()

    class Stuck(Plain):
        calls = 0

        def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:  # type: ignore[override]
            Stuck.calls += 1
            if Stuck.calls == 1:
                return []
            release.wait(12)  # far past any wait it was asked for
            return self.queue.take(batch_size)

    took = run_loop(lambda: Stuck(queue), queue, lambda: Stuck.calls >= 2, wait_seconds=0.2)
    assert took < 10  # one slice (1 s) and the margin (5 s), with room for a loaded machine
    release.set()
    deadline = time.monotonic() + 5
    while not queue.nacks and time.monotonic() < deadline:
        time.sleep(0.02)
    assert dict(queue.nacks) == {"m0": 1} and not queue.processed  # handed back, not lost


def test_a_fetch_that_returns_at_once_on_an_empty_queue_does_not_spin() -> None:
    queue = Queue(0)
    calls: list[float] = []

    class Instant(Plain):
        def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:  # type: ignore[override]
            calls.append(time.monotonic())
            return []

    started = time.monotonic()
    run_loop(lambda: Instant(queue), queue, lambda: time.monotonic() - started > 1.5)
    assert len(calls) < 60  # one per 50 ms pause, not thousands


def test_the_sync_face_refuses_to_wait_on_its_own_loop() -> None:
    home = LoopThread("test-face-home")

    async def nested() -> None:
        async def inner() -> None:
            return None

        home.run(inner())  # a plain call made on the loop it would wait for

    try:
        with pytest.raises(RuntimeError, match="its own loop"):
            home.run(nested())
        home.run(asyncio.sleep(0))  # and the loop still serves others
    finally:
        home.stop()


def test_the_deprecated_names_warn_and_still_work_on_an_async_transport() -> None:
    sent: list[str] = []

    class Native(TransportConsumer):
        async def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
            return [QueueMessage(body="x", message_id="x")]

        async def ack(self, message: QueueMessage) -> None:
            pass

        async def nack(self, message: QueueMessage, delay_seconds: float | None = None) -> bool:
            return True

    class NativeTransport(QueueTransport):
        async def send(self, queue: QueueName, message: QueueMessage) -> str | None:
            sent.append(message.body)
            return "id"

    async def old_names() -> tuple[Any, ...]:
        consumer, transport = Native(), NativeTransport()
        got = await consumer.fetch_async(1, 0.1)
        delayed = await consumer.nack_later(got[0], 1.0)
        return got, delayed, await transport.send_async(QueueName.INPUT, got[0])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, delayed, sent_id = asyncio.run(old_names())
    assert ([m.body for m in got], delayed, sent_id, sent) == (["x"], True, "id", ["x"])
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 3


def test_the_deprecated_names_on_a_plain_transport_run_it_once_on_a_thread() -> None:
    sent: list[str] = []
    queue = Queue(1)

    class PlainTransport(QueueTransport):
        def send(self, queue: QueueName, message: QueueMessage) -> str | None:  # type: ignore[override]
            sent.append(message.body)
            return "id"

    async def old_names() -> tuple[Any, ...]:
        consumer = Plain(queue)
        got = await consumer.fetch_async(1, 0.1)
        delayed = await consumer.nack_later(got[0], 1.0)  # a plain nack cannot delay
        return got, delayed, await PlainTransport().send_async(QueueName.INPUT, got[0])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got, delayed, sent_id = asyncio.run(old_names())
    assert ([m.body for m in got], delayed, sent_id, sent) == (["m0"], False, "id", ["m0"])
    assert not queue.nacks  # nothing handed back by a nack_later that answered False


class OnItsLoop(TransportConsumer):
    """An async consumer bound to a loop of its own, as NATS's is; its ack takes a while."""

    def __init__(self, home: LoopThread, fail: bool = False) -> None:
        self.home, self.fail = home, fail
        self.acked: list[str] = []

    def home_loop(self) -> LoopThread:
        return self.home

    async def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        return [QueueMessage(body=",".join(self.acked))]  # what was acked before this fetch

    async def ack(self, message: QueueMessage) -> None:
        if self.fail:
            raise RuntimeError("the broker said no")
        time.sleep(0.2)  # blocks its loop: a later call waits behind it
        self.acked.append(message.body)


def test_the_face_queues_an_ack_on_the_consumers_loop_and_later_calls_see_it() -> None:
    home = LoopThread("home-ack-test")
    try:
        face = SyncConsumer(OnItsLoop(home))
        started = time.monotonic()
        face.ack(QueueMessage(body="a"))
        face.ack(QueueMessage(body="b"))
        assert time.monotonic() - started < 0.15  # not waited for
        assert [m.body for m in face.fetch(1, 0.0)] == ["a,b"]  # run before the fetch, in order
    finally:
        home.stop()


def test_a_failed_ack_queued_by_the_face_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    home = LoopThread("home-ack-fail-test")
    try:
        face = SyncConsumer(OnItsLoop(home, fail=True))
        face.ack(QueueMessage(body="a"))
        face.fetch(1, 0.0)  # runs after the ack: its failure is logged by then
        deadline = time.monotonic() + 2.0
        while "the broker said no" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "an ack queued on its consumer's loop failed" in caplog.text
        assert "the broker said no" in caplog.text
    finally:
        home.stop()
