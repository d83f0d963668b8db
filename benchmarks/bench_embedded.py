"""Embedded topology benchmarks, side by side in one run.

1. Sync latency: POST /api/v1/chat with a no-op agent (through INPUT, runner, OUTPUT, store)
   against POST /bench/trivial (a plain FastAPI route on the same server), and against calling
   the agent directly. Pipeline overhead = chat p50 - trivial p50.
2. Throughput of no-op turns over HTTP against the trivial route, with concurrent clients, in
   alternating rounds (chat, trivial, chat, ...) so machine noise hits both alike; the ratio is
   the median of the per-round ratios. CPU per request is the server process's CPU seconds
   (user + system, from psutil) over the requests wrk completed in that round.
3. In-flight concurrency: 1,000 sessions, an agent that awaits 1 s per turn, run by the async
   Agent Runner against a runner that runs one turn per consumer thread (5 threads).

Usage: python benchmarks/bench_embedded.py [--requests 2000] [--concurrency 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

from agentkernel import Agent, AgentRegistry, Turn
from agentkernel.core.config import AKConfig, ExecutionConfig, RunnerConfig
from agentkernel.pipeline.agent_runner import AgentRunner
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport

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


def cpu_seconds(server: psutil.Process) -> float:
    times = server.cpu_times()
    return float(times.user + times.system)


def wrk_round(
    url: str, path: str, seconds: int, connections: int, server: psutil.Process
) -> tuple[float, float]:
    """(requests/s, server CPU microseconds per request) of one wrk run (a C load generator)."""
    import re
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    cpu_before = cpu_seconds(server)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url + path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cpu = cpu_seconds(server) - cpu_before
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    assert non2xx is None, out
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return rate, cpu / max(done, 1) * 1e6


def wrk_rounds(
    url: str, rounds: int, seconds: int, connections: int, server: psutil.Process
) -> dict[str, list[tuple[float, float]]]:
    """Alternate chat and trivial wrk runs ``rounds`` times; (req/s, CPU us/req) per run."""
    results: dict[str, list[tuple[float, float]]] = {"chat": [], "trivial": []}
    for _ in range(rounds):
        results["chat"].append(wrk_round(url, "/api/v1/chat", seconds, connections, server))
        results["trivial"].append(wrk_round(url, "/bench/trivial", seconds, connections, server))
    return results


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
    execution = ExecutionConfig(runner=RunnerConfig(max_in_flight=2000))
    config = AKConfig.load().model_copy(update={"execution": execution})
    runner = AgentRunner(config, registry, transport=transport, sessions=InMemorySessionStore())
    if async_runner:
        loop = runner.consumer_loop(stop=threading.Event())
    else:  # the seeds' model: each consumer thread runs one turn at a time
        loop = ConsumerLoop.from_handlers(
            process=lambda m: asyncio.run(runner.process_message(m)),
            on_permanent_failure=lambda m: None,
            consumer_factory=lambda: transport.create_consumer(QueueName.INPUT),
            num_consumers=5,
        )
    for i in range(turns):
        body = json.dumps({"session_id": f"s{i}", "prompt": "x", "agent": "sleeper"})
        transport.send(
            QueueName.INPUT,
            QueueMessage(body=body, group_id=f"s{i}", attributes={"request_id": str(i)}),
        )
    thread = threading.Thread(target=loop.run, kwargs={"exit_on_shutdown": False}, daemon=True)
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


def load() -> str:
    return " ".join(f"{x:.2f}" for x in psutil.getloadavg())


def print_rounds(rounds: dict[str, list[tuple[float, float]]]) -> None:
    print("| path | req/s per round | median req/s | median server CPU us/request |")
    print("|---|---|---|---|")
    for name, key in (("pipeline (no-op turn)", "chat"), ("trivial FastAPI route", "trivial")):
        rates = ", ".join(f"{rate:.0f}" for rate, _ in rounds[key])
        rate = statistics.median(r for r, _ in rounds[key])
        cpu = statistics.median(c for _, c in rounds[key])
        print(f"| {name} | {rates} | {rate:.0f} | {cpu:.0f} |")
    pairs = list(zip(rounds["chat"], rounds["trivial"], strict=True))
    ratios = sorted(chat[0] / trivial[0] for chat, trivial in pairs)
    cpu_ratio = statistics.median(chat[1] / trivial[1] for chat, trivial in pairs)
    print(
        f"\nratio pipeline/trivial: median {statistics.median(ratios):.2f} "
        f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}); CPU per request ratio {cpu_ratio:.2f}"
    )
    turn_cpu = statistics.median(c for _, c in rounds["chat"])
    print(f"CPU per turn (embedded, over HTTP): {turn_cpu / 1000:.3f} ms\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="alternating wrk rounds")
    parser.add_argument("--seconds", type=int, default=4, help="seconds per wrk round")
    args = parser.parse_args()

    print(f"load average at start: {load()}\n")
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
        server = psutil.Process(proc.pid)
        rounds: dict[str, list[tuple[float, float]]] | None = None
        if shutil.which("wrk") is not None:
            rounds = wrk_rounds(url, args.rounds, args.seconds, args.concurrency, server)
            tool = f"wrk, {args.rounds} alternating rounds of {args.seconds} s"
        else:
            tp_chat = asyncio.run(throughput(url, "/api/v1/chat", args.requests, args.concurrency))
            tp_trivial = asyncio.run(
                throughput(url, "/bench/trivial", args.requests, args.concurrency)
            )
            tool = f"httpx, {args.requests} requests; the Python client may be the bottleneck"
        load_after_http = load()
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
    if rounds is None:
        print(f"| path | req/s |\n|---|---|\n| pipeline | {tp_chat:.0f} |")
        print(f"| trivial | {tp_trivial:.0f} |\n\nratio: {tp_chat / tp_trivial:.2f}\n")
    else:
        print_rounds(rounds)
    print(f"load average after the HTTP part: {load_after_http}\n")

    ours, ours_s = sleeping_turns(1000, async_runner=True, time_limit=60)
    base, base_s = sleeping_turns(1000, async_runner=False, time_limit=20)
    print("## 1-second turns over 1,000 sessions")
    print("| runner | turns finished | seconds | turns/s |\n|---|---|---|---|")
    print(f"| async Agent Runner | {ours} | {ours_s:.1f} | {ours / ours_s:.1f} |")
    print(f"| one turn per thread (5 threads) | {base} | {base_s:.1f} | {base / base_s:.1f} |")
    print(f"\nratio: {(ours / ours_s) / (base / base_s):.0f}x")


if __name__ == "__main__":
    main()
