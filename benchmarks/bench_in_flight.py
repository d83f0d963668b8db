"""Turns in flight in one Agent Runner process: time, and memory per turn in flight.

N sessions each send one turn of an agent that awaits 1 s; the in-memory transport carries them
to an Agent Runner in this process, consuming INPUT on its event loop as the embedded topology
does (``--threads``: with consumer threads, as a runner on a broker does). Each size runs in a
fresh interpreter so its RSS is its own: RSS at idle (runner started, nothing queued), peak RSS
while the turns are in flight, and the extra memory per turn in flight, counting the queued
messages and the replies waiting on OUTPUT. The 1,000-turn run is the baseline for the 10,000 one.

Usage: python benchmarks/bench_in_flight.py [--sizes 1000 10000] [--max-in-flight 10000] [--threads]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import threading
import time

import psutil

from agentkernel import Agent, AgentRegistry, Turn
from agentkernel.core.config.execution import ExecutionConfig, RunnerConfig
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.consumer.in_loop import InLoopConsumer
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


async def sleeper(turn: Turn) -> str:
    await asyncio.sleep(1.0)
    return "done"


def run_one(turns: int, max_in_flight: int, threads: bool) -> dict[str, float]:
    """Run ``turns`` one-second turns in this process; returns the measurements."""
    process = psutil.Process()
    transport = InMemoryTransport()
    registry = AgentRegistry()
    registry.register(Agent("sleeper", sleeper))
    runner = AgentRunner(
        AKConfig.load().model_copy(
            update={"execution": ExecutionConfig(runner=RunnerConfig(max_in_flight=max_in_flight))}
        ),
        registry,
        transport=transport,
        sessions=InMemorySessionStore(),
    )
    if threads:
        loop = runner.consumer_loop(stop=threading.Event())
        thread = threading.Thread(target=loop.run, kwargs={"exit_on_shutdown": False}, daemon=True)
        thread.start()
        stop = loop.stop
    else:
        consumer = InLoopConsumer(
            runner.handling(),
            lambda: transport.create_consumer(QueueName.INPUT),
            max_in_flight=max_in_flight,
            name="input",
        )
        loop_thread = LoopThread("runner")
        loop_thread.loop.call_soon_threadsafe(consumer.start)
        stop = consumer.stop
    output = transport.create_consumer(QueueName.OUTPUT)
    bodies = [
        json.dumps({"session_id": f"s{i}", "prompt": "x", "agent": "sleeper"}) for i in range(turns)
    ]
    time.sleep(1.0)  # the runner's threads and loop are up and idle
    gc.collect()
    idle_rss = process.memory_info().rss
    cpu_before = process.cpu_times()
    started = time.perf_counter()
    for i, body in enumerate(bodies):
        message = QueueMessage(body=body, group_id=f"s{i}", attributes={"request_id": str(i)})
        transport.send(QueueName.INPUT, message)
    peak_rss = process.memory_info().rss
    in_flight_seen = 0
    done = 0
    while done < turns and time.perf_counter() - started < 60:
        peak_rss = max(peak_rss, process.memory_info().rss)
        in_flight_seen = max(in_flight_seen, transport.in_flight(QueueName.INPUT))
        for message in output.fetch(1000, 0.05):
            output.ack(message)
            done += 1
    elapsed = time.perf_counter() - started
    cpu_after = process.cpu_times()
    stop()
    if threads:
        thread.join(30)
    else:
        consumer.wait_stopped(30)
        loop_thread.stop()
    cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    return {
        "turns": turns,
        "finished": done,
        "seconds": elapsed,
        "max_in_flight_seen": in_flight_seen,
        "idle_rss_mb": idle_rss / 2**20,
        "peak_rss_mb": peak_rss / 2**20,
        "kb_per_turn": (peak_rss - idle_rss) / 1024 / turns,
        "cpu_ms_per_turn": cpu * 1000 / max(done, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--max-in-flight", type=int, default=None)
    parser.add_argument("--threads", action="store_true", help="consumer threads, not in-loop")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        limit = args.max_in_flight or RunnerConfig().in_flight_limit(queues_in_process=True)
        print(json.dumps(run_one(args.child, limit, args.threads)))
        return
    print(f"load average before: {' '.join(f'{x:.2f}' for x in psutil.getloadavg())}")
    print("| turns | finished | seconds | most in flight | idle RSS MB | peak RSS MB |", end="")
    print(" KB per turn in flight | CPU ms per turn |")
    print("|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        command = [sys.executable, __file__, "--child", str(size)]
        if args.max_in_flight:
            command += ["--max-in-flight", str(args.max_in_flight)]
        if args.threads:
            command.append("--threads")
        result = json.loads(subprocess.run(command, capture_output=True, check=True).stdout)
        print(
            f"| {result['turns']:,} | {result['finished']:,} | {result['seconds']:.2f} "
            f"| {result['max_in_flight_seen']:,} | {result['idle_rss_mb']:.1f} "
            f"| {result['peak_rss_mb']:.1f} | {result['kb_per_turn']:.1f} "
            f"| {result['cpu_ms_per_turn']:.3f} |"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in psutil.getloadavg())}")


if __name__ == "__main__":
    main()
