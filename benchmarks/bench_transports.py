"""Pipeline transport against the raw broker client doing the same work, side by side.

For each transport: publish N messages (50 sessions, 200-byte bodies), then fetch and
acknowledge all of them with one consumer, first through the raw client library, then through
the agentkernel transport. Reported as messages per second and the pipeline/raw ratio.

  python benchmarks/bench_transports.py nats  [--url nats://127.0.0.1:4222] [-n 2000]
  python benchmarks/bench_transports.py kafka [-n 2000]        (starts a Tansu broker itself)
  python benchmarks/bench_transports.py redis [--url redis://127.0.0.1:6379/0] [-n 2000]

``--rounds R`` runs raw and ours back to back R times and reports medians (a shared machine's
load drifts between runs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.blocking import is_async
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

BODY = "x" * 200
SESSIONS = 50


def timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def pipeline_rates(transport: QueueTransport, n: int) -> tuple[float, float]:
    """Publish, then fetch and ack, ``n`` messages as plain code calls the transport: a blocking
    one directly, an async one (NATS) through the sync face."""
    if is_async(transport):
        transport = SyncTransport(transport)  # type: ignore[assignment]

    def publish() -> None:
        for i in range(n):
            transport.send(
                QueueName.INPUT,
                QueueMessage(
                    body=BODY,
                    group_id=f"s{i % SESSIONS}",
                    dedup_id=uuid.uuid4().hex,
                    attributes={"request_id": str(i)},
                ),
            )

    consumer = transport.create_consumer(QueueName.INPUT)

    def consume() -> None:
        done = 0
        while done < n:
            for message in consumer.fetch(10, 1.0):
                consumer.ack(message)
                done += 1

    rates = n / timed(publish), n / timed(consume)
    consumer.close()
    return rates


# -- NATS -------------------------------------------------------------------------------------


def raw_nats(url: str, n: int) -> tuple[float, float]:
    import nats

    async def run() -> tuple[float, float]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        name = f"RAW_{uuid.uuid4().hex[:8].upper()}"
        await js.add_stream(name=name, subjects=[f"{name}.*"])
        started = time.perf_counter()
        for i in range(n):
            await js.publish(
                f"{name}.s{i % SESSIONS}", BODY.encode(), headers={"Nats-Msg-Id": uuid.uuid4().hex}
            )
        publish = n / (time.perf_counter() - started)
        sub = await js.pull_subscribe(f"{name}.*", durable="raw")
        started, done = time.perf_counter(), 0
        while done < n:
            for msg in await sub.fetch(10, timeout=1):
                await msg.ack_sync()
                done += 1
        consume = n / (time.perf_counter() - started)
        await js.delete_stream(name)
        await nc.close()
        return publish, consume

    return asyncio.run(run())


def pipeline_nats(url: str, n: int) -> tuple[float, float]:
    from agentkernel.core.config.queues import NatsQueueConfig
    from agentkernel.pipeline.transport.nats import NatsTransport

    tag = uuid.uuid4().hex[:8].upper()
    settings = NatsQueueConfig(
        url=url,
        input_stream=f"BIN_{tag}",
        input_subject_prefix=f"b{tag}.in",
        output_stream=f"BOUT_{tag}",
        output_subject_prefix=f"b{tag}.out",
        partitions=32,
        auto_provision=True,
    )
    return pipeline_rates(NatsTransport(settings), n)


# -- Kafka ------------------------------------------------------------------------------------

TANSU = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 10}


def raw_kafka(bootstrap: str, n: int) -> tuple[float, float]:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"raw-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=8)]).values():
        future.result(10)
    time.sleep(1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})

    def publish() -> None:  # wait for each delivery report, as the pipeline's send does
        for i in range(n):
            producer.produce(topic, BODY.encode(), key=f"s{i % SESSIONS}".encode())
            producer.flush(10)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **TANSU,
        }
    )
    consumer.subscribe([topic])

    def consume() -> None:
        done = 0
        while done < n:
            for record in consumer.consume(500, 0.1):
                if record.error() is None:
                    consumer.commit(message=record, asynchronous=False)
                    done += 1

    rates = n / timed(publish), n / timed(consume)
    consumer.close()
    return rates


def pipeline_kafka(bootstrap: str, n: int) -> tuple[float, float]:
    from agentkernel.core.config.queues import KafkaQueueConfig
    from agentkernel.pipeline.transport.kafka import KafkaTransport

    tag = uuid.uuid4().hex[:8]
    settings = KafkaQueueConfig(
        bootstrap_servers=bootstrap,
        input_topic=f"bin-{tag}",
        output_topic=f"bout-{tag}",
        group_id=f"b-{tag}",
        auto_provision=True,
        partitions=8,
        consumer_config=TANSU,
        bookkeeping="in_memory",  # one short-lived process: nothing to survive
    )
    return pipeline_rates(KafkaTransport(settings), n)


# -- Redis Streams ----------------------------------------------------------------------------


def raw_redis(url: str, n: int) -> tuple[float, float]:
    """XADD per message; XREADGROUP of 10, then one XACK per message (as the pipeline acks)."""
    import redis

    client = redis.Redis.from_url(url)
    stream = f"bench:raw:{uuid.uuid4().hex[:8]}"
    client.xgroup_create(stream, "raw", id="0", mkstream=True)

    def publish() -> None:
        for i in range(n):
            client.xadd(stream, {"b": BODY, "s": f"s{i % SESSIONS}", "a": str(i)})

    def consume() -> None:
        done = 0
        while done < n:
            for _, entries in client.xreadgroup("raw", "c", {stream: ">"}, count=10, block=1000):
                for entry_id, _ in entries:
                    client.xack(stream, "raw", entry_id)
                    done += 1

    rates = n / timed(publish), n / timed(consume)
    client.delete(stream)
    client.close()
    return rates


def pipeline_redis(url: str, n: int) -> tuple[float, float]:
    from agentkernel.core.config.queues import RedisQueueConfig
    from agentkernel.pipeline.transport.redis import RedisStreamsTransport

    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    transport = RedisStreamsTransport(RedisQueueConfig(url=url, prefix=prefix, auto_provision=True))
    try:
        return pipeline_rates(transport, n)
    finally:
        for key in transport.client.scan_iter(match="{" + prefix + "*"):
            transport.client.delete(key)
        transport.close()


def start_tansu() -> tuple[Any, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.servers import Tansu

    broker = Tansu()
    return broker, broker.bootstrap


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["nats", "kafka", "redis"])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--url", help="server URL (default: NATS or Redis on 127.0.0.1)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternate raw and ours this often; report medians"
    )
    args = parser.parse_args()
    broker = None
    if args.transport == "nats":
        url = args.url or "nats://127.0.0.1:4222"
        pair = (raw_nats, pipeline_nats)
    elif args.transport == "redis":
        url = args.url or "redis://127.0.0.1:6379/0"
        pair = (raw_redis, pipeline_redis)
    else:
        broker, url = start_tansu()
        pair = (raw_kafka, pipeline_kafka)
    try:
        rounds = [(pair[0](url, args.n), pair[1](url, args.n)) for _ in range(args.rounds)]
    finally:
        if broker is not None:
            broker.stop()
    report(args.transport, args.n, rounds)


def report(
    name: str, n: int, rounds: list[tuple[tuple[float, float], tuple[float, float]]]
) -> None:
    """One table: each figure the median over the rounds (ratios: median of per-round ratios,
    since raw and ours ran back to back under the same load)."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    raw = [med([r[0][i] for r in rounds]) for i in (0, 1)]
    ours = [med([r[1][i] for r in rounds]) for i in (0, 1)]
    ratio = [med([r[1][i] / r[0][i] for r in rounds]) for i in (0, 1)]
    print(f"## {name}: {n} messages, {SESSIONS} sessions, one consumer, {len(rounds)} round(s)")
    print("| | publish msg/s | fetch+ack msg/s |\n|---|---|---|")
    print(f"| raw client | {raw[0]:.0f} | {raw[1]:.0f} |")
    print(f"| agentkernel transport | {ours[0]:.0f} | {ours[1]:.0f} |")
    print(f"| ratio | {ratio[0]:.2f} | {ratio[1]:.2f} |")


if __name__ == "__main__":
    main()
