"""Count replays on Kafka while consumer processes are killed with ``kill -9`` over and over.

30 sessions x 20 turns flow through a 4-partition topic into two worker processes (each a
``KafkaConsumer`` with up to 16 turns in flight, 50-300 ms per turn, Redis bookkeeping). Every
``--interval`` seconds one worker is killed with SIGKILL and started again. At the end every
delivery is classified:

- replay of a finished turn: delivered again after an earlier delivery finished its work (a
  worker reports a turn done just before it acknowledges it);
- replay of an in-flight turn: delivered again after an earlier delivery that never finished
  (it was running when its worker died) - unavoidable with at-least-once delivery;
- a reset count: ``receive_count`` lower than the number of deliveries seen so far (a count
  higher than that is a delivery whose worker died before reporting it, not an error);
- lost: never finished; out of order: a session's turns finished out of order.

  python benchmarks/kafka_crash_replays.py [--kills 10] [--interval 5]   (starts Tansu itself;
                                                                          Redis on 127.0.0.1)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentkernel.core.config.queues import KafkaQueueConfig  # noqa: E402
from agentkernel.pipeline.transport.kafka import KafkaTransport  # noqa: E402
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName  # noqa: E402

SESSIONS, TURNS, IN_FLIGHT = 30, 20, 16
TANSU = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 10}


def worker(settings_json: str) -> None:
    """One consumer process: prints ``[event, body, receive_count, monotonic time]`` lines."""
    settings = KafkaQueueConfig.model_validate_json(settings_json)
    consumer = KafkaTransport(settings).create_consumer(QueueName.INPUT)
    slots = threading.Semaphore(IN_FLIGHT)
    out = threading.Lock()

    def emit(event: str, message: QueueMessage) -> None:
        with out:
            print(json.dumps([event, message.body, message.receive_count, time.monotonic()]))
            sys.stdout.flush()

    def turn(message: QueueMessage) -> None:
        time.sleep(random.uniform(0.05, 0.3))
        emit("done", message)  # the turn's work is done; a kill from here on may replay it
        consumer.ack(message)
        slots.release()

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        while True:
            slots.acquire()
            messages = consumer.fetch(1, 0.5)
            if not messages:
                slots.release()
            for message in messages:
                emit("start", message)
                pool.submit(turn, message)


class Worker:
    def __init__(self, settings: KafkaQueueConfig, events: list[Any], lock: threading.Lock):
        env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT / "src"))}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", settings.model_dump_json()],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._events, self._lock = events, lock
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:  # the last line of a killed worker
                continue
            with self._lock:
                self._events.append(event)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def classify(events: list[Any]) -> dict[str, int]:
    events = sorted(events, key=lambda e: e[3])
    state: dict[str, str] = {}  # body -> "running" | "done"
    deliveries: dict[str, int] = defaultdict(int)
    done_order: dict[str, list[int]] = defaultdict(list)
    names = ["deliveries", "finished_replays", "in_flight_replays", "counts_reset"]
    result = dict.fromkeys(names, 0)
    for event, body, count, _ in events:
        previous = state.get(body)
        if event == "start":
            result["deliveries"] += 1
            if previous is not None:
                result["finished_replays" if previous == "done" else "in_flight_replays"] += 1
            deliveries[body] += 1
            result["counts_reset"] += count < deliveries[body]
            # A worker killed between counting a delivery and reporting it leaves a gap.
            deliveries[body] = max(deliveries[body], count)
            state[body] = previous or "running"
        elif previous != "done":
            state[body] = "done"
            session, turn = body.split("/")
            done_order[session].append(int(turn))
    result["lost"] = SESSIONS * TURNS - sum(1 for s in state.values() if s == "done")
    result["out_of_order"] = sum(order != sorted(order) for order in done_order.values())
    return result


def run(bootstrap: str, redis_url: str, kills: int, interval: float) -> dict[str, int]:
    tag = uuid.uuid4().hex[:8]
    settings = KafkaQueueConfig(
        bootstrap_servers=bootstrap,
        input_topic=f"crash-in-{tag}",
        output_topic=f"crash-out-{tag}",
        group_id=f"crash-{tag}",
        auto_provision=True,
        partitions=4,
        bookkeeping="redis",
        bookkeeping_redis_url=redis_url,
        rebalance_drain_timeout=10,
        consumer_config=TANSU,
    )
    transport = KafkaTransport(settings)
    events: list[Any] = []
    lock = threading.Lock()
    workers = [Worker(settings, events, lock) for _ in range(2)]

    def produce() -> None:  # the turns keep arriving while workers die
        for turn in range(TURNS):
            for session in range(SESSIONS):
                body = f"s{session}/{turn}"
                transport.send(QueueName.INPUT, QueueMessage(body=body, group_id=f"s{session}"))
            time.sleep(interval * kills / TURNS / 2)

    producer = threading.Thread(target=produce)
    producer.start()
    for i in range(kills):
        time.sleep(interval)
        workers[i % 2].kill()
        workers[i % 2] = Worker(settings, events, lock)
    producer.join()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with lock:
            if classify(list(events))["lost"] == 0:
                break
        time.sleep(1)
    for w in workers:
        w.kill()
    with lock:
        return classify(list(events))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    from tests.servers import Tansu

    broker = Tansu()
    try:
        result = run(broker.bootstrap, args.redis, args.kills, args.interval)
    finally:
        broker.stop()
    print(f"## {SESSIONS} sessions x {TURNS} turns, {args.kills} x kill -9 every {args.interval}s")
    for name, value in result.items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
