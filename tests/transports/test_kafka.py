"""The Kafka transport against a real Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from agentkernel.core.config.queues import KafkaQueueConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.bookkeeping import InMemoryBookkeepingStore
from agentkernel.pipeline.transport.kafka import KafkaTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.foreign import KAFKA_KINDS, publish_kafka

pytestmark = pytest.mark.kafka

# Tansu needs a short session timeout (the default makes the first join take ~23 s) and a short
# fetch wait (it answers a parked fetch only when the wait ends).
TANSU_CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 10}


def kafka_settings(bootstrap: str, **overrides: Any) -> KafkaQueueConfig:
    tag = uuid.uuid4().hex[:10]
    base: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "input_topic": f"in-{tag}",
        "output_topic": f"out-{tag}",
        "group_id": f"g-{tag}",
        "retry_backoff": 0,
        "dedup_window": 2.0,
        "auto_provision": True,
        "partitions": 4,
        "consumer_config": TANSU_CONSUMER,
    }
    return KafkaQueueConfig.model_validate(base | overrides)


class TestKafkaTransportContract(QueueTransportContract):
    fetch_wait = 20.0
    dedup_window = 2.0
    # A Kafka consumer group has no per-record lease: a record handed to a live consumer comes
    # back only when its partition is reassigned (consumer closed, crashed or evicted), never on
    # a timer; so there is nothing to expire, extend, or go stale.
    timeout_redelivery = False
    lease_extension = False
    undecodable_kinds = KAFKA_KINDS

    @pytest.fixture(autouse=True)
    def _server(self, tansu_broker: Any) -> None:
        self.bootstrap = tansu_broker.bootstrap

    def make_transport(self) -> QueueTransport:
        return KafkaTransport(kafka_settings(self.bootstrap), InMemoryBookkeepingStore())

    def send_undecodable(
        self, transport: QueueTransport, queue: QueueName, kind: str, group: str, request_id: str
    ) -> str | None:
        assert isinstance(transport, KafkaTransport)
        return publish_kafka(transport, queue, kind, group, request_id)


def test_missing_topics_fail_fast_naming_them(tansu_broker: Any) -> None:
    settings = kafka_settings(tansu_broker.bootstrap, auto_provision=False)
    with pytest.raises(AKConfigError, match=settings.input_topic):
        KafkaTransport(settings, InMemoryBookkeepingStore())


def test_unreachable_broker_fails_the_send(tansu_broker: Any) -> None:
    transport = KafkaTransport(kafka_settings(tansu_broker.bootstrap), InMemoryBookkeepingStore())
    dead = transport.settings.model_copy(
        update={"bootstrap_servers": "127.0.0.1:1", "delivery_timeout": 1.0}
    )
    broken = object.__new__(KafkaTransport)
    broken.__dict__.update(transport.__dict__, settings=dead, _producer=None)
    from agentkernel.core.errors import TransportError

    with pytest.raises(TransportError):
        broken.send(QueueName.INPUT, QueueMessage(body="lost?", group_id="g"))


# -- bookkeeping ----------------------------------------------------------------------------------

import json  # noqa: E402
import queue  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

from agentkernel.pipeline.consumer.loop import ConsumerLoop  # noqa: E402
from agentkernel.pipeline.transport.bookkeeping import (  # noqa: E402
    BookkeepingStore,
    RedisBookkeepingStore,
)
from agentkernel.pipeline.transport.in_memory import ManualClock  # noqa: E402


def check_bookkeeping(store: BookkeepingStore, advance: Any) -> None:
    part = f"g:t-{uuid.uuid4().hex}:0"
    assert [store.start_delivery(part, 7) for _ in range(3)] == [1, 2, 3]
    store.finish(part, 7)
    assert store.start_delivery(part, 7) == 0  # finished: the next owner skips it
    assert store.start_delivery(part, 8) == 1
    store.forget(part, 8, [7])  # a commit at 8 covers offset 7
    assert store.start_delivery(part, 7) == 1  # nothing left of it
    assert store.start_delivery(part, 8) == 2  # not covered: its count goes on
    dedup = uuid.uuid4().hex
    assert store.claim_dedup(dedup, "t:0:5", 1.0)
    assert store.claim_dedup(dedup, "t:0:5", 1.0)  # the owner's redelivery is not a duplicate
    assert not store.claim_dedup(dedup, "t:0:9", 1.0)  # another record with the same id is
    advance(1.2)
    assert store.claim_dedup(dedup, "t:0:9", 1.0)  # the window has passed


def test_in_memory_bookkeeping() -> None:
    clock = ManualClock()
    check_bookkeeping(InMemoryBookkeepingStore(clock), clock.advance)


@pytest.mark.redis
def test_redis_bookkeeping(redis_url: str) -> None:
    check_bookkeeping(RedisBookkeepingStore(redis_url, f"t:{uuid.uuid4().hex}:"), time.sleep)


# -- behaviour on a real broker -------------------------------------------------------------


class Victim:
    """``kafka_victim.py`` in a subprocess, read line by line with a timeout."""

    def __init__(self, settings: KafkaQueueConfig, count: int, mode: str) -> None:
        script = str(Path(__file__).with_name("kafka_victim.py"))
        self.proc = subprocess.Popen(
            [sys.executable, script, settings.model_dump_json(), str(count), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def until_settled(self, timeout: float = 60) -> list[Any]:
        seen: list[Any] = []
        deadline = time.monotonic() + timeout
        while not seen or seen[-1] != "settled":
            seen.append(self.lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        return seen[:-1]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=10)


def fetch_until(consumer: Any, body: str, timeout: float = 60) -> list[tuple[str, int]]:
    """Fetch and acknowledge everything up to the record ``body``; (body, receive_count) each."""
    got: list[tuple[str, int]] = []
    deadline = time.monotonic() + timeout
    while body not in [b for b, _ in got]:
        assert time.monotonic() < deadline, f"{body} not received; got {got}"
        for message in consumer.fetch(10, 1.0):
            got.append((message.body, message.receive_count))
            consumer.ack(message)
    return got


@pytest.mark.redis
def test_kill_9_moves_partitions_and_redelivers_with_exact_counts(
    tansu_broker: Any, redis_url: str
) -> None:
    settings = kafka_settings(
        tansu_broker.bootstrap, bookkeeping="redis", bookkeeping_redis_url=redis_url
    )
    transport = KafkaTransport(settings)
    for i in range(4):
        transport.send(QueueName.INPUT, QueueMessage(body=f"r{i}", group_id=f"s{i}"))
    victim = Victim(settings, 4, "hold")
    assert sorted(victim.until_settled()) == [[f"r{i}", 1] for i in range(4)]
    victim.kill()
    survivor = transport.create_consumer(QueueName.INPUT)
    try:
        got: list[QueueMessage] = []
        deadline = time.monotonic() + 60
        while len(got) < 4 and time.monotonic() < deadline:
            got += survivor.fetch(10, 1.0)
        assert sorted((m.body, m.receive_count) for m in got) == [(f"r{i}", 2) for i in range(4)]
    finally:
        survivor.close()


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["ack-behind", "ack-behind-unmarked"])
def test_a_crash_replays_only_what_was_in_flight(
    tansu_broker: Any, redis_url: str, mode: str
) -> None:
    # One partition: r1..r5 sit behind r0, so the committed offset cannot pass r0 while it runs.
    settings = kafka_settings(
        tansu_broker.bootstrap,
        bookkeeping="redis",
        bookkeeping_redis_url=redis_url,
        partitions=1,
    )
    transport = KafkaTransport(settings)
    for i in range(6):
        transport.send(QueueName.INPUT, QueueMessage(body=f"r{i}", group_id=f"s{i}"))
    victim = Victim(settings, 6, mode)
    assert sorted(victim.until_settled()) == [[f"r{i}", 1] for i in range(6)]
    victim.kill()  # r0 in flight, r1..r5 acknowledged, no commit past r0
    transport.send(QueueName.INPUT, QueueMessage(body="end", group_id="last"))
    survivor = transport.create_consumer(QueueName.INPUT)
    try:
        got = sorted(fetch_until(survivor, "end"))
    finally:
        survivor.close()
    if mode == "ack-behind":  # the finished marks let the survivor skip r1..r5
        assert got == [("end", 1), ("r0", 2)]
    else:  # without them r1..r5 run again, and their counts go on from the first delivery
        assert got == [("end", 1)] + [(f"r{i}", 2) for i in range(6)]


@pytest.mark.redis
def test_redis_bookkeeping_keys_expire(redis_url: str) -> None:
    import redis

    prefix = f"t:{uuid.uuid4().hex}:"
    store = RedisBookkeepingStore(redis_url, prefix, ttl=60)
    store.start_delivery("g:t:0", 3)
    store.finish("g:t:0", 4)
    client = redis.Redis.from_url(redis_url)
    keys = client.keys(prefix + "*")
    assert len(keys) == 2 and all(0 < client.ttl(k) <= 60 for k in keys)
    store.forget("g:t:0", 5, [3, 4])
    assert client.keys(prefix + "*") == []  # nothing left once a commit covers everything


def test_ack_during_a_rebalance_returns_and_the_partition_moves(tansu_broker: Any) -> None:
    """An ack while the client waits in its revoke callback for that very ack (it deadlocked)."""
    settings = kafka_settings(tansu_broker.bootstrap, partitions=2, rebalance_drain_timeout=30)
    first = KafkaTransport(settings, InMemoryBookkeepingStore())
    second = KafkaTransport(settings, InMemoryBookkeepingStore())  # only commits carry over
    for i in range(8):
        first.send(QueueName.INPUT, QueueMessage(body=f"old{i}", group_id=f"s{i}"))
    a = first.create_consumer(QueueName.INPUT)
    held: list[QueueMessage] = []
    deadline = time.monotonic() + 60
    while len(held) < 8:
        assert time.monotonic() < deadline, f"only {len(held)} fetched"
        held += a.fetch(10, 1.0)
    seen = {"a": [], "b": []}
    stop = threading.Event()

    def run(name: str, consumer: Any) -> None:  # a runner keeps fetching, as ConsumerLoop does
        while not stop.is_set():
            for message in consumer.fetch(10, 0.2):
                seen[name].append(message.body)
                consumer.ack(message)

    b = second.create_consumer(QueueName.INPUT)  # joins the group: a must give a partition up
    threads = [threading.Thread(target=run, args=p) for p in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    try:
        time.sleep(4)  # the rebalance starts; a's revoke waits for the 8 records it holds
        acker = threading.Thread(target=lambda: [a.ack(m) for m in held], daemon=True)
        started = time.monotonic()
        acker.start()
        acker.join(10)
        assert not acker.is_alive(), "ack() did not return during the rebalance"
        assert time.monotonic() - started < 5
        for i in range(20):
            first.send(QueueName.INPUT, QueueMessage(body=f"new{i}", group_id=f"n{i}"))
        deadline = time.monotonic() + 60
        while len(seen["a"]) + len(seen["b"]) < 20:
            assert time.monotonic() < deadline, f"only {seen} received"
            time.sleep(0.1)
        assert seen["b"], "the second consumer never got a partition"
        assert sorted(seen["a"] + seen["b"]) == sorted(f"new{i}" for i in range(20))
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        a.close()
        b.close()


def test_poison_record_goes_to_the_dlq_topic(tansu_broker: Any) -> None:
    from confluent_kafka import Consumer

    settings = kafka_settings(tansu_broker.bootstrap)
    transport = KafkaTransport(settings, InMemoryBookkeepingStore())
    transport.send(
        QueueName.INPUT, QueueMessage(body="poison", group_id="s", attributes={"k": "v"})
    )
    hooked: list[int] = []
    loop = ConsumerLoop.from_handlers(
        process=lambda m: 1 / 0,
        on_permanent_failure=lambda m: hooked.append(m.receive_count),
        consumer_factory=lambda: transport.create_consumer(QueueName.INPUT),
        max_receive_count=2,
        wait_seconds=0.5,
    )
    runner = threading.Thread(target=loop.run)
    runner.start()
    deadline = time.monotonic() + 60
    while not hooked and time.monotonic() < deadline:
        time.sleep(0.1)
    loop.stop()
    runner.join(30)
    assert hooked == [3]
    reader = Consumer(
        {
            "bootstrap.servers": tansu_broker.bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            **TANSU_CONSUMER,
        }
    )
    reader.subscribe([settings.input_topic + settings.dlq_suffix])
    try:
        record = None
        deadline = time.monotonic() + 30
        while record is None and time.monotonic() < deadline:
            polled = reader.poll(0.5)
            record = polled if polled is not None and polled.error() is None else None
        assert record is not None and record.value() == b"poison"
        headers = dict(record.headers() or [])
        assert headers["ak-error"] == b"exceeded max_receive_count"
        assert headers["ak-attr:k"] == b"v"
    finally:
        reader.close()


def test_two_consumers_in_one_group_keep_each_session_in_order(tansu_broker: Any) -> None:
    transport = KafkaTransport(kafka_settings(tansu_broker.bootstrap), InMemoryBookkeepingStore())
    seen: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()

    async def process(m: QueueMessage) -> None:
        import asyncio

        await asyncio.sleep(0.005)
        with lock:
            seen[m.group_id or ""].append(int(m.body))

    loop = ConsumerLoop.from_handlers(
        process=process,
        on_permanent_failure=lambda m: None,
        num_consumers=2,
        batch_size=10,
        consumer_factory=lambda: transport.create_consumer(QueueName.INPUT),
        wait_seconds=0.5,
    )
    runner = threading.Thread(target=loop.run)
    runner.start()
    sessions, per_session = [f"s{i}" for i in range(12)], 20
    for i in range(per_session):
        for session in sessions:
            transport.send(QueueName.INPUT, QueueMessage(body=str(i), group_id=session))
    deadline = time.monotonic() + 90
    while sum(map(len, seen.values())) < len(sessions) * per_session:
        assert time.monotonic() < deadline, f"only {sum(map(len, seen.values()))} processed"
        time.sleep(0.1)
    loop.stop()
    runner.join(30)
    assert dict(seen) == {s: list(range(per_session)) for s in sessions}


def test_a_consumer_closed_while_joining_does_not_leave_its_group_stuck(tansu_broker: Any) -> None:
    """An IO process stopped a second after it started: its consumer is still joining the group.

    Tansu never rebalanced that group again when the member left mid-join, so the next consumer
    got no partition (the chaos suite's kafka-sigterm-io); the consumer now lets the join end first.
    """
    transport = KafkaTransport(kafka_settings(tansu_broker.bootstrap), InMemoryBookkeepingStore())
    first = transport.create_consumer(QueueName.OUTPUT)
    first.fetch(10, 0.5)  # its first join takes ~3 s on Tansu
    first.close()
    transport.send(QueueName.OUTPUT, QueueMessage(body="after", group_id="s1"))
    second = transport.create_consumer(QueueName.OUTPUT)
    try:
        assert fetch_until(second, "after", timeout=30)
    finally:
        second.close()
