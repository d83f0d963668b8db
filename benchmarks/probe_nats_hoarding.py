"""Probe: does a NATS consumer nobody fetches from keep messages reserved? (3 processes)

Three consumer processes share one INPUT stream of 16 partitions (``ack_wait`` 30 s, so a
reserved message would stay stuck for 30 s):

- ``saturated``: a ConsumerLoop with ``max_in_flight`` 4 whose turns never finish, so after its
  first fetches it stops fetching, like a runner at ``max_in_flight``;
- two ``idle`` replicas: ConsumerLoops whose turns take 10 ms, waiting for work.

Once the saturated one holds its 4 turns, the probe publishes ``--sessions`` x ``--turns``
messages over all partitions and reports where they went: every message outside the 4
partitions the saturated replica is legitimately running must reach the idle replicas, and the
saturated replica must hold nothing it did not hand out (``held``). Then it stops the saturated
replica (SIGTERM: a drain that hands its unfinished turns back) and reports how long the
remaining messages took to reach the others and how many deliveries were repeats.

  python benchmarks/probe_nats_hoarding.py [--url nats://127.0.0.1:4222] [--sessions 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.transport.nats import NatsTransport, partition_of
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

PARTITIONS = 16
SATURATED_IN_FLIGHT = 4


def settings(url: str, tag: str) -> NatsQueueConfig:
    return NatsQueueConfig(
        url=url,
        input_stream=f"HOARD_IN_{tag}",
        input_subject_prefix=f"hoard{tag}.in",
        output_stream=f"HOARD_OUT_{tag}",
        output_subject_prefix=f"hoard{tag}.out",
        partitions=PARTITIONS,
        ack_wait=30.0,
        auto_provision=True,
    )


# -- worker processes -------------------------------------------------------------------------


_emitting = threading.Lock()


def emit(**event: Any) -> None:
    with _emitting:  # lines from the loop and the reporting thread must not interleave
        print(json.dumps(event), flush=True)


def worker(url: str, tag: str, role: str) -> None:
    transport = SyncTransport(NatsTransport(settings(url, tag)))
    consumers: list[Any] = []
    stop = threading.Event()

    def factory() -> Any:
        consumers.append(transport.create_consumer(QueueName.INPUT))
        return consumers[-1]

    async def process(message: QueueMessage) -> None:
        emit(role=role, event="got", group=message.group_id, count=message.receive_count)
        if role == "saturated":
            while not stop.is_set():  # a turn that lasts until the process is told to stop
                await asyncio.sleep(0.05)
            raise RuntimeError("stopped before the turn finished")
        await asyncio.sleep(0.01)

    saturated = role == "saturated"
    loop = ConsumerLoop.from_handlers(
        process=process,
        on_permanent_failure=lambda m: None,
        consumer_factory=factory,
        num_consumers=2,
        batch_size=SATURATED_IN_FLIGHT if saturated else 10,
        max_in_flight=SATURATED_IN_FLIGHT if saturated else 64,
        wait_seconds=1.0,
        queue=QueueName.INPUT,
        stop=threading.Event(),
        drain_timeout=1.0,
    )

    def on_term(*_: Any) -> None:
        stop.set()
        threading.Thread(target=loop.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=report_held, args=(consumers, role, stop), daemon=True).start()
    emit(role=role, event="ready")
    loop.run()
    emit(role=role, event="exit")


def report_held(consumers: list[Any], role: str, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        emit(role=role, event="held", n=sum(c.held for c in list(consumers)))


# -- the probe --------------------------------------------------------------------------------


class Worker:
    def __init__(self, url: str, tag: str, role: str, name: str) -> None:
        self.name, self.events, self.started = name, [], time.monotonic()
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", role, "--tag", tag, "--url", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if role == "saturated" else None,  # its cut-off turns
            env=env,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            event["t"] = time.monotonic()
            self.events.append(event)

    def got(self, since: float = 0.0) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "got" and e["t"] >= since]

    def max_held(self, since: float = 0.0) -> int:
        held = [e["n"] for e in self.events if e["event"] == "held" and e["t"] >= since]
        return max(held, default=0)

    def wait_for(self, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e["event"] == what for e in self.events):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} did not report {what}")
            time.sleep(0.02)


def wait_until(done: Any, timeout: float) -> float:
    started = time.monotonic()
    while not done() and time.monotonic() - started < timeout:
        time.sleep(0.02)
    return time.monotonic() - started


def probe(args: argparse.Namespace) -> None:
    tag = uuid.uuid4().hex[:8].upper()
    transport = SyncTransport(NatsTransport(settings(args.url, tag)))
    saturated = Worker(args.url, tag, "saturated", "saturated")
    saturated.wait_for("ready", 20)
    for i in range(SATURATED_IN_FLIGHT * 3):  # its first turns, on as many partitions as exist
        transport.send(QueueName.INPUT, QueueMessage(body="warm", group_id=f"warm{i}"))
    wait_until(lambda: len(saturated.got()) >= SATURATED_IN_FLIGHT, 20)
    idle = [Worker(args.url, tag, "idle", f"idle-{n}") for n in (1, 2)]
    for w in idle:
        w.wait_for("ready", 20)
    time.sleep(1.0)  # every replica has fetched (and found nothing) a few times
    busy = {partition_of(e["group"], PARTITIONS) for e in saturated.got()}
    groups = [f"s{i}" for i in range(args.sessions)]
    free = [g for g in groups if partition_of(g, PARTITIONS) not in busy]
    start = time.monotonic()
    for turn in range(args.turns):
        for group in groups:
            transport.send(QueueName.INPUT, QueueMessage(body=str(turn), group_id=group))
    expected = len(free) * args.turns

    def free_done() -> int:
        return sum(1 for w in idle for e in w.got(start) if e["group"] in free)

    wait_until(lambda: free_done() >= expected, 25.0)
    took = time.monotonic() - start
    print(f"## NATS, {PARTITIONS} partitions, ack_wait 30 s, 3 consumer processes")
    print(f"saturated replica: {len(saturated.got())} turns in flight on partitions {sorted(busy)}")
    print(
        f"published {args.sessions * args.turns} messages ({args.sessions} sessions x "
        f"{args.turns}); {expected} on the {PARTITIONS - len(busy)} free partitions"
    )
    print(
        f"idle replicas took {free_done()}/{expected} of those in {took:.2f} s from the first "
        "publish "
        f"({', '.join(f'{w.name}: {len(w.got(start))}' for w in idle)}); "
        f"saturated replica took {len(saturated.got(start))} and held at most "
        f"{saturated.max_held(start)} it had not handed out"
    )
    saturated.proc.send_signal(signal.SIGTERM)
    total = args.sessions * args.turns + SATURATED_IN_FLIGHT * 3
    took = wait_until(lambda: sum(len(w.got()) for w in idle) >= total, 60.0)
    repeats = [e for w in idle for e in w.got() if e["count"] > 1]
    print(
        f"after SIGTERM to the saturated replica: all {total} messages reached the idle "
        f"replicas: {sum(len(w.got()) for w in idle) >= total}, in {took:.2f} s; "
        f"{len(repeats)} deliveries were repeats: "
        f"{sorted((e['group'], e['count']) for e in repeats)}"
    )
    for w in [saturated, *idle]:
        w.proc.terminate()
        w.proc.wait(30)
    for stream in (f"HOARD_IN_{tag}", f"HOARD_OUT_{tag}"):
        transport.run(transport.conn.js.delete_stream(stream))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--worker", choices=["saturated", "idle"])
    parser.add_argument("--tag")
    args = parser.parse_args()
    if args.worker:
        worker(args.url, args.tag, args.worker)
    else:
        probe(args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
