"""Embedded topology benchmarks, side by side in one run.

Every server runs at its default settings, in its own process (``_embedded_server.py``; with
``--upstream``, also ``_upstream_server.py``).

1. Sync latency: POST /api/v1/chat with a no-op agent (through INPUT, runner, OUTPUT, store)
   against POST /bench/trivial (a plain FastAPI route on the same server), and against calling
   the agent directly. Pipeline overhead = chat p50 - trivial p50.
2. Throughput of no-op turns over HTTP against the trivial route (and, with ``--upstream``,
   upstream agentkernel's REST API without any queue), with concurrent clients, in alternating
   rounds (chat, trivial, upstream, chat, ...) so machine noise hits all alike; each ratio is
   the median of the per-round ratios. CPU per request is the server process's CPU seconds
   (user + system, from psutil) over the requests wrk completed in that round.
3. 1,000 sessions at once over HTTP, each turn an agent that awaits 1 s (``wrk -c1000``, every
   request a new session, the next request of a connection sent when its reply is in): the
   pipeline against ``POST /bench/sleep``, a plain FastAPI route that awaits 1 s (and the
   upstream), alternating rounds: turns/s and latency p50 of each, ratio of the turns/s.
4. In-flight concurrency in one process: 1,000 sessions, an agent that awaits 1 s per turn, run
   by the async Agent Runner against a runner that runs one turn per consumer thread (5 threads).

Usage: python benchmarks/bench_embedded.py [--requests 2000] [--concurrency 32] [--rounds 5]
    [--upstream PYTHON] [--baseline SRC] [--sessions 1000] [--sleep-seconds 10]

``--upstream PYTHON``: a Python 3.12 that has upstream agentkernel installed, e.g.
``python3.12 -m venv up && up/bin/pip install 'agentkernel[api]==0.9.5' python-multipart``.
``--baseline SRC``: the ``src`` folder of another checkout of this project (``git worktree``),
served by the same script beside this one as ``before``.
A server with no request answered in a round (a machine too busy for 1,000 connections in
the round's seconds) counts 0 for it; its ratios are then ``nan``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from math import nan
from pathlib import Path

import httpx
import psutil

from agentkernel import Agent, AgentRegistry, Turn
from agentkernel.core.config.execution import ExecutionConfig, RunnerConfig
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

HERE = Path(__file__).parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    python: str = sys.executable, script: str = "_embedded_server.py", src: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a benchmark server; ``src``: import agentkernel from this source folder instead."""
    port = free_port()
    env = os.environ | ({"PYTHONPATH": src} if src else {})
    proc = subprocess.Popen(
        [python, str(HERE / script), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
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


#: Every request a session of its own: wrk's threads each run this script in a Lua state of their
#: own, whose counter and unseeded ``math.random`` start alike, so the session id also names the
#: thread (``setup``) and the round (``BENCH_RUN``). Before 2026-12-05 it named neither: both
#: threads sent each session id at once, and every round sent the same ones again, so a round's
#: turns went to sessions with up to two turns per earlier round behind them.
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local agent = os.getenv("BENCH_AGENT") or "noop"
local run = os.getenv("BENCH_RUN") or "0"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil,
    '{"session_id": "wrk-' .. run .. '-' .. tid .. '-' .. counter .. '", "prompt": "hi", '
    .. '"agent": "' .. agent .. '"}')
end
"""


@dataclass
class Target:
    """One route under load: its name in the report, its URL and its server process."""

    name: str
    url: str
    server: psutil.Process
    agent: str = "noop"


@dataclass
class WrkResult:
    rate: float  # requests/s
    cpu_us: float  # server CPU microseconds per request
    p50_ms: float = 0.0


def cpu_seconds(server: psutil.Process) -> float:
    times = server.cpu_times()
    return float(times.user + times.system)


def wrk_round(target: Target, seconds: int, connections: int) -> WrkResult:
    """Requests/s, server CPU per request and latency p50 of one wrk run (a C load generator)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    cpu_before = cpu_seconds(target.server)
    command = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "30s"]
    out = subprocess.run(
        [*command, "-s", script.name, target.url],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "BENCH_AGENT": target.agent, "BENCH_RUN": uuid.uuid4().hex[:12]},
    ).stdout
    cpu = cpu_seconds(target.server) - cpu_before
    assert re.search(r"Non-2xx or 3xx responses", out) is None, out
    assert re.search(r"Socket errors", out) is None, out
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return WrkResult(rate, cpu / max(done, 1) * 1e6, wrk_p50(out))


def wrk_p50(out: str) -> float:
    """The latency p50 wrk printed (``--latency``), in ms."""
    value, unit = re.search(r"50%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk_rounds(
    targets: list[Target], rounds: int, seconds: int, connections: int
) -> dict[str, list[WrkResult]]:
    """Run every target in turn, ``rounds`` times, so the machine's noise hits all alike."""
    results: dict[str, list[WrkResult]] = {target.name: [] for target in targets}
    for _ in range(rounds):
        for target in targets:
            results[target.name].append(wrk_round(target, seconds, connections))
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


def print_rounds(rounds: dict[str, list[WrkResult]], base: str, latency: bool = False) -> None:
    """A table of the rounds, then each target's per-round ratio of req/s to ``base``'s."""
    print("| path | req/s per round | median req/s | median p50 ms | median server CPU us/req |")
    print("|---|---|---|---|---|")
    for name, results in rounds.items():
        rates = ", ".join(f"{r.rate:.0f}" for r in results)
        rate = statistics.median(r.rate for r in results)
        p50 = statistics.median(r.p50_ms for r in results)
        cpu = statistics.median(r.cpu_us for r in results)
        print(f"| {name} | {rates} | {rate:.0f} | {p50:.1f} | {cpu:.0f} |")
    print()
    for name, results in rounds.items():
        if name == base:
            continue
        pairs = list(zip(results, rounds[base], strict=True))
        ratios = sorted(ours.rate / theirs.rate if theirs.rate else nan for theirs, ours in pairs)
        cpu_ratio = statistics.median(
            ours.cpu_us / theirs.cpu_us if theirs.cpu_us else nan for theirs, ours in pairs
        )
        print(
            f"ratio {base} / {name}: median {statistics.median(ratios):.2f} "
            f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}); "
            f"CPU per request ratio {cpu_ratio:.2f}"
        )
    turn_cpu = statistics.median(r.cpu_us for r in rounds[base])
    print(f"CPU per turn ({base}, over HTTP): {turn_cpu / 1000:.3f} ms\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="alternating wrk rounds")
    parser.add_argument("--seconds", type=int, default=4, help="seconds per wrk round")
    parser.add_argument("--upstream", help="a Python with upstream agentkernel (0.9.5) installed")
    parser.add_argument("--sessions", type=int, default=1000, help="sessions of 1 s turns")
    parser.add_argument("--sleep-seconds", type=int, default=10, help="seconds per 1 s-turn round")
    parser.add_argument("--sleep-rounds", type=int, default=3, help="rounds of 1 s turns")
    parser.add_argument("--skip-in-process", action="store_true", help="skip part 4")
    parser.add_argument(
        "--baseline", help="the src folder of another checkout, run beside this one as 'before'"
    )
    args = parser.parse_args()

    print(f"load average at start: {load()}\n")
    servers = [start_server()]
    try:
        proc, url = servers[0]
        if args.upstream:
            servers.append(start_server(args.upstream, "_upstream_server.py"))
        with httpx.Client(base_url=url, timeout=30) as client:
            latency(client, "/api/v1/chat", 200)  # warm-up
            latency(client, "/bench/trivial", 200)
            chat, trivial = [], []
            for _ in range(5):  # interleave so machine noise hits both alike
                chat += latency(client, "/api/v1/chat", args.requests // 5)
                trivial += latency(client, "/bench/trivial", args.requests // 5)
        direct = direct_agent_latency(args.requests)
        server = psutil.Process(proc.pid)
        targets = [
            Target("pipeline", url + "/api/v1/chat", server),
            Target("trivial", url + "/bench/trivial", server),
        ]
        sleepers = [
            Target("pipeline", url + "/api/v1/chat", server, "sleep1"),
            Target("plain sleep", url + "/bench/sleep", server),
        ]
        if args.upstream:
            up_proc, up_url = servers[1]
            up_server = psutil.Process(up_proc.pid)
            targets.append(Target("upstream", up_url + "/api/v1/chat", up_server))
            sleepers.append(Target("upstream", up_url + "/api/v1/chat", up_server, "sleep1"))
        if args.baseline:
            servers.append(start_server(src=args.baseline))
            old_proc, old_url = servers[-1]
            old_server = psutil.Process(old_proc.pid)
            targets.append(Target("before", old_url + "/api/v1/chat", old_server))
            sleepers.append(Target("before", old_url + "/api/v1/chat", old_server, "sleep1"))
        rounds: dict[str, list[WrkResult]] | None = None
        if shutil.which("wrk") is not None:
            rounds = wrk_rounds(targets, args.rounds, args.seconds, args.concurrency)
            tool = f"wrk, {args.rounds} alternating rounds of {args.seconds} s"
            sleeping = wrk_rounds(sleepers, args.sleep_rounds, args.sleep_seconds, args.sessions)
        else:
            tp_chat = asyncio.run(throughput(url, "/api/v1/chat", args.requests, args.concurrency))
            tp_trivial = asyncio.run(
                throughput(url, "/bench/trivial", args.requests, args.concurrency)
            )
            tool = f"httpx, {args.requests} requests; the Python client may be the bottleneck"
        load_after_http = load()
    finally:
        for proc, _ in servers:
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
    print(f"## Throughput of no-op turns, {args.concurrency} concurrent connections ({tool})")
    if rounds is None:
        print(f"| path | req/s |\n|---|---|\n| pipeline | {tp_chat:.0f} |")
        print(f"| trivial | {tp_trivial:.0f} |\n\nratio: {tp_chat / tp_trivial:.2f}\n")
    else:
        print_rounds(rounds, "pipeline")
    if shutil.which("wrk") is not None and args.sleep_rounds > 0:  # --sleep-rounds 0: skipped
        print(
            f"## {args.sessions:,} sessions at once, 1 s turns (wrk -c{args.sessions}, "
            f"{args.sleep_rounds} alternating rounds of {args.sleep_seconds} s)"
        )
        print_rounds(sleeping, "pipeline")
    print(f"load average after the HTTP part: {load_after_http}\n")
    if args.skip_in_process:
        return
    ours, ours_s = sleeping_turns(1000, async_runner=True, time_limit=60)
    base, base_s = sleeping_turns(1000, async_runner=False, time_limit=20)
    print("## 1-second turns over 1,000 sessions, in one process (no HTTP)")
    print("| runner | turns finished | seconds | turns/s |\n|---|---|---|---|")
    print(f"| async Agent Runner | {ours} | {ours_s:.1f} | {ours / ours_s:.1f} |")
    print(f"| one turn per thread (5 threads) | {base} | {base_s:.1f} | {base / base_s:.1f} |")
    if base:
        print(f"\nratio: {(ours / ours_s) / (base / base_s):.0f}x")


if __name__ == "__main__":
    main()
