"""Embedded topology benchmarks, side by side in one run.

1. Sync latency: POST /api/v1/chat with a no-op agent (through INPUT, runner, OUTPUT, store)
   against POST /bench/trivial (a plain FastAPI route on the same server), and against calling
   the agent directly. Pipeline overhead = chat p50 - trivial p50.
2. Throughput of no-op turns over HTTP against the trivial route, with concurrent clients.
3. In-flight concurrency: 1,000 sessions, an agent that awaits 1 s per turn, run by the async
   Agent Runner against a runner that runs one turn per consumer thread (5 threads).

Usage: python benchmarks/bench_embedded.py [--requests 2000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agentkernel import Agent, AgentRegistry, Turn
from agentkernel.core.config import QueuesConfig, RunnerConfig
from agentkernel.pipeline.agent_runner import AgentRunner
from agentkernel.pipeline.consumer import ConsumerLoop
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.session.in_memory import InMemorySessionStore

HERE = Path(__file__).parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_embedded_server.py"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("benchmark server did not start")


def latency(client: httpx.Client, path: str, n: int) -> list[float]:
    samples = []
    for i in range(n):
        body = {"session_id": f"lat-{i % 50}", "prompt": "hi", "agent": "noop"}
        started = time.perf_counter()
        response = client.post(path, json=body)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text
    return samples


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil,
    '{"session_id": "wrk-' .. counter .. '-' .. math.random(1, 1e9) .. '", "prompt": "hi"}')
end
"""


def wrk_throughput(url: str, path: str, seconds: int, connections: int) -> float | None:
    """Requests/s measured by wrk (a C load generator), or None when wrk is not installed."""
    import re
    import shutil
    import tempfile

    if shutil.which("wrk") is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url + path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    assert non2xx is None, out
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


async def throughput(url: str, path: str, n: int, concurrency: int) -> float:
    async with httpx.AsyncClient(
        base_url=url, timeout=60, limits=httpx.Limits(max_connections=concurrency)
    ) as client:
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                body = {"session_id": f"tp-{i}", "prompt": "hi", "agent": "noop"}
                response = await client.post(path, json=body)
                assert response.status_code == 200, response.text

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - started)


def direct_agent_latency(n: int) -> list[float]:
    agent = Agent("noop", lambda turn: "ok")

    async def run() -> list[float]:
        out = []
        for i in range(n):
            turn = Turn(prompt="hi", session_id="s", request_id=str(i), agent="noop")
            started = time.perf_counter()
            await agent.run(turn)
            out.append((time.perf_counter() - started) * 1000)
        return out

    return asyncio.run(run())


def sleeping_turns(turns: int, async_runner: bool, time_limit: float) -> tuple[int, float]:
    """Run ``turns`` one-second turns; returns (turns finished, seconds)."""
    transport = InMemoryTransport()
    registry = AgentRegistry()

    async def sleeper(turn: Turn) -> str:
        await asyncio.sleep(1.0)
        return "done"

    registry.register(Agent("sleeper", sleeper))
    queues = QueuesConfig()
    runner = AgentRunner(
        transport,
        registry=registry,
        sessions=InMemorySessionStore(),
        queues=queues,
        runner=RunnerConfig(max_in_flight=2000),
    )
    if async_runner:
        loop = runner.consumer_loop(exit_on_shutdown=False)
    else:  # the seeds' model: each consumer thread runs one turn at a time
        loop = ConsumerLoop(
            process=lambda m: asyncio.run(runner.process_message(m)),
            on_permanent_failure=lambda m: None,
            consumer_factory=lambda: transport.create_consumer(QueueName.INPUT),
            num_consumers=5,
            exit_on_shutdown=False,
        )
    for i in range(turns):
        body = json.dumps({"session_id": f"s{i}", "prompt": "x", "agent": "sleeper"})
        transport.send(
            QueueName.INPUT,
            QueueMessage(body=body, group_id=f"s{i}", attributes={"request_id": str(i)}),
        )
    import threading

    thread = threading.Thread(target=loop.run, daemon=True)
    started = time.perf_counter()
    thread.start()
    output = transport.create_consumer(QueueName.OUTPUT)
    done = 0
    while done < turns and time.perf_counter() - started < time_limit:
        for message in output.fetch(100, 0.2):
            output.ack(message)
            done += 1
    elapsed = time.perf_counter() - started
    loop.stop()
    thread.join(15)
    return done, elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    proc, url = start_server()
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            latency(client, "/api/v1/chat", 200)  # warm-up
            latency(client, "/bench/trivial", 200)
            chat, trivial = [], []
            for _ in range(5):  # interleave so machine noise hits both alike
                chat += latency(client, "/api/v1/chat", args.requests // 5)
                trivial += latency(client, "/bench/trivial", args.requests // 5)
        direct = direct_agent_latency(args.requests)
        tp_chat = wrk_throughput(url, "/api/v1/chat", 10, args.concurrency)
        tp_trivial = wrk_throughput(url, "/bench/trivial", 10, args.concurrency)
        tool = "wrk, 10 s each"
        if tp_chat is None or tp_trivial is None:
            tp_chat = asyncio.run(throughput(url, "/api/v1/chat", args.requests, args.concurrency))
            tp_trivial = asyncio.run(
                throughput(url, "/bench/trivial", args.requests, args.concurrency)
            )
            tool = f"httpx, {args.requests} requests; the Python client may be the bottleneck"
    finally:
        proc.terminate()
        proc.wait(20)

    print("## Sync latency, ms (sequential, one client)")
    print("| path | p50 | p99 |\n|---|---|---|")
    for name, values in (
        ("POST /api/v1/chat (pipeline)", chat),
        ("POST /bench/trivial (plain FastAPI)", trivial),
        ("agent called directly", direct),
    ):
        print(f"| {name} | {statistics.median(values):.3f} | {percentile(values, 0.99):.3f} |")
    overhead = statistics.median(chat) - statistics.median(trivial)
    print(f"\npipeline overhead at p50: {overhead:.3f} ms (chat p50 - trivial p50)\n")
    print(f"## Throughput, {args.concurrency} concurrent connections ({tool})")
    print(
        f"| path | req/s |\n|---|---|\n| pipeline | {tp_chat:.0f} |\n| trivial | {tp_trivial:.0f} |"
    )
    print(f"\nratio pipeline/trivial: {tp_chat / tp_trivial:.2f}\n")

    ours, ours_s = sleeping_turns(1000, async_runner=True, time_limit=60)
    base, base_s = sleeping_turns(1000, async_runner=False, time_limit=20)
    print("## 1-second turns over 1,000 sessions")
    print("| runner | turns finished | seconds | turns/s |\n|---|---|---|---|")
    print(f"| async Agent Runner | {ours} | {ours_s:.1f} | {ours / ours_s:.1f} |")
    print(f"| one turn per thread (5 threads) | {base} | {base_s:.1f} | {base / base_s:.1f} |")
    print(f"\nratio: {(ours / ours_s) / (base / base_s):.0f}x")


if __name__ == "__main__":
    main()
