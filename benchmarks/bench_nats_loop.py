"""NATS publish and fetch+ack as the pipeline drives them: awaited on the connection's loop.

bench_transports.py calls a transport from plain code (threads); the consumer loop and the
runner instead await the NATS transport on its connection's event loop, with no thread between.
This measures that path, and runs against the transport API before and after issue 43 (sync
methods with ``send_async``/``fetch_async``, or the async ones), so one copy of the script
compares two trees.

Usage: PYTHONPATH=<tree>/src python benchmarks/bench_nats_loop.py [-n 2000] [--url URL] [--rounds 5]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
import uuid
from typing import Any

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.pipeline.transport.nats import NatsTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

BODY = "x" * 200
SESSIONS = 50


def transport_for(url: str) -> Any:
    tag = uuid.uuid4().hex[:8].upper()
    return NatsTransport(
        NatsQueueConfig(
            url=url,
            input_stream=f"LIN_{tag}",
            output_stream=f"LOUT_{tag}",
            input_subject_prefix=f"lin.{tag}",
            output_subject_prefix=f"lout.{tag}",
            auto_provision=True,
            partitions=8,
        )
    )


async def publish(transport: Any, n: int) -> float:
    send = transport.send if inspect.iscoroutinefunction(transport.send) else transport.send_async
    started = time.perf_counter()
    for i in range(n):
        message = QueueMessage(body=BODY, group_id=f"s{i % SESSIONS}", dedup_id=uuid.uuid4().hex)
        await send(QueueName.INPUT, message)
    return n / (time.perf_counter() - started)


async def consume(consumer: Any, n: int) -> float:
    is_async = inspect.iscoroutinefunction(type(consumer).fetch)
    fetch = consumer.fetch if is_async else consumer.fetch_async
    started, done = time.perf_counter(), 0
    while done < n:
        for message in await fetch(10, 1.0):
            if is_async:
                await consumer.ack(message)
            else:
                consumer.ack(message)  # called on its loop, it does not wait
            done += 1
    return n / (time.perf_counter() - started)


def one_round(url: str, n: int) -> tuple[float, float]:
    transport = transport_for(url)
    consumer = transport.create_consumer(QueueName.INPUT)
    home = consumer.home_loop()
    sent = home.run(publish(transport, n))
    received = home.run(consume(consumer, n))
    streams = (transport.settings.input_stream, transport.settings.output_stream)
    closing = consumer.close()
    if inspect.isawaitable(closing):
        home.run(closing)
    for stream in streams:
        transport.run(transport.conn.js.delete_stream(stream))
    return sent, received


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rounds = [one_round(args.url, args.n) for _ in range(args.rounds)]
    print("| on the connection's loop | publish msg/s | fetch+ack msg/s |")
    print("|---|---|---|")
    sent = statistics.median(r[0] for r in rounds)
    received = statistics.median(r[1] for r in rounds)
    print(f"| agentkernel transport | {sent:.0f} | {received:.0f} |")
    NatsTransport.reset()


if __name__ == "__main__":
    main()
