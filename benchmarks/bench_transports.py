"""Pipeline transport against the raw broker client doing the same work, side by side.

For each transport: publish N messages (50 sessions, 200-byte bodies), then fetch and
acknowledge all of them with one consumer, first through the raw client library, then through
the agentkernel transport. Reported as messages per second and the pipeline/raw ratio.

  python benchmarks/bench_transports.py nats  [--url nats://127.0.0.1:4222] [-n 2000]
  python benchmarks/bench_transports.py kafka [-n 2000]        (starts a Tansu broker itself)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.transport.base import QueueTransport

BODY = "x" * 200
SESSIONS = 50


def timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def pipeline_rates(transport: QueueTransport, n: int) -> tuple[float, float]:
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
    from agentkernel.core.config import NatsQueueConfig
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
    from agentkernel.core.config import KafkaQueueConfig
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


def start_tansu() -> tuple[Any, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.servers import Tansu

    broker = Tansu()
    return broker, broker.bootstrap


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["nats", "kafka"])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    args = parser.parse_args()
    broker = None
    if args.transport == "nats":
        raw, ours = raw_nats(args.url, args.n), pipeline_nats(args.url, args.n)
    else:
        broker, bootstrap = start_tansu()
        try:
            raw, ours = raw_kafka(bootstrap, args.n), pipeline_kafka(bootstrap, args.n)
        finally:
            broker.stop()
    print(f"## {args.transport}: {args.n} messages, {SESSIONS} sessions, one consumer")
    print("| | publish msg/s | fetch+ack msg/s |\n|---|---|---|")
    print(f"| raw client | {raw[0]:.0f} | {raw[1]:.0f} |")
    print(f"| agentkernel transport | {ours[0]:.0f} | {ours[1]:.0f} |")
    print(f"| ratio | {ours[0] / raw[0]:.2f} | {ours[1] / raw[1]:.2f} |")


if __name__ == "__main__":
    main()
