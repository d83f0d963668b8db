"""Streaming benchmarks: time to first token through the pipeline, and chunks per second.

1. Time to first token: the agent yields its own wall-clock time as its first token; the client
   subtracts it from the time the SSE event arrived. Run embedded (``agentkernel serve``) and
   split (``agentkernel io`` + ``agentkernel runner`` on NATS JetStream + Redis), sequentially.
2. Chunks per second delivered over SSE: one client, then 100 concurrent clients, each turn
   yielding ``--chunks`` chunks as fast as the agent can; and 100 clients x a tenth as many
   (where the cost of a turn, not of its chunks, sets the pace).
3. Model-paced streams: ``--paced-clients`` turns at once, each yielding ``--paced-chunks``
   chunks ``--interval`` seconds apart (50 a second by default, a model's pace), each chunk its
   own clock: chunks per second delivered and every chunk's delay (agent -> client).

Usage: python benchmarks/bench_streaming.py [--turns 200] [--chunks 200] [--split]
(--split needs NATS on 127.0.0.1:4222 and Redis on 127.0.0.1:6379.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).parent
AGENTS = HERE / "_stream_agents.py"
SSE = {"Accept": "text/event-stream"}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


LOG_DIR: list[Path] = []  # --log-dir: where the servers' output goes (default: nowhere)


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    out: Any = subprocess.DEVNULL
    if LOG_DIR:
        out = (LOG_DIR[0] / f"{args[0]}-{uuid.uuid4().hex[:6]}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "agentkernel", *args],
        env=os.environ | env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def wait_healthy(url: str) -> None:
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not start")


def first_token_delays(url: str, turns: int) -> list[float]:
    delays = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(turns):
            body = {"session_id": f"ttft-{i % 20}", "prompt": "go", "agent": "stamp"}
            with client.stream("POST", "/api/v1/chat", json=body, headers=SSE) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        frame = json.loads(line[6:])
                        delays.append((time.time() - float(frame["delta"])) * 1000)
                        break
    return delays


async def one_stream(client: httpx.AsyncClient, chunks: int) -> int:
    body = {"session_id": uuid.uuid4().hex, "prompt": "go", "agent": "burst", "count": chunks}
    received = 0
    async with client.stream("POST", "/api/v1/chat", json=body, headers=SSE) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                frame = json.loads(line[6:])
                if frame.get("done"):
                    if "error" in frame:
                        raise RuntimeError(f"stream failed: {frame['error']}: {frame['message']}")
                    return received
                received += 1
    return received


async def paced_stream(client: httpx.AsyncClient, body: dict[str, Any], delays: list[float]) -> int:
    received = 0
    async with client.stream("POST", "/api/v1/chat", json=body, headers=SSE) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                frame = json.loads(line[6:])
                if frame.get("done"):
                    if "error" in frame:
                        raise RuntimeError(f"stream failed: {frame['error']}: {frame['message']}")
                    return received
                delays.append((time.time() - float(frame["delta"])) * 1000)
                received += 1
    return received


async def paced_rate(
    url: str, clients: int, chunks: int, interval: float
) -> tuple[float, list[float]]:
    """Chunks per second delivered, and each chunk's delay in ms, for model-paced streams."""
    limits = httpx.Limits(max_connections=clients + 5)
    delays: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        started = time.perf_counter()
        counts = await asyncio.gather(
            *(paced_stream(client, paced_body(chunks, interval), delays) for _ in range(clients))
        )
        elapsed = time.perf_counter() - started
    assert all(c == chunks for c in counts), counts
    return sum(counts) / elapsed, delays


def paced_body(chunks: int, interval: float) -> dict[str, Any]:
    session = uuid.uuid4().hex
    return {
        "session_id": session,
        "prompt": "go",
        "agent": "paced",
        "count": chunks,
        "interval": interval,
    }


async def chunk_rate(url: str, clients: int, chunks: int) -> float:
    limits = httpx.Limits(max_connections=clients + 5)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        started = time.perf_counter()
        counts = await asyncio.gather(*(one_stream(client, chunks) for _ in range(clients)))
        elapsed = time.perf_counter() - started
    assert all(c == chunks for c in counts), counts
    return sum(counts) / elapsed


def report(name: str, delays: list[float], what: str = "first-token delay") -> None:
    ordered = sorted(delays)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    print(f"{name:<28} {what} p50 {statistics.median(delays):7.2f} ms   p99 {p99:7.2f} ms")


def rates(name: str, url: str, args: argparse.Namespace) -> None:
    """The chunk-rate and paced runs of one topology."""
    for clients, chunks in ((1, args.chunks), (100, args.chunks // 10), (100, args.chunks)):
        label = f"{name}, {clients:>3} SSE client(s) x {chunks:>3}"
        try:
            rate = asyncio.run(chunk_rate(url, clients, chunks))
        except (RuntimeError, AssertionError, httpx.HTTPError) as exc:  # a stream timed out
            print(f"{label}   failed: {str(exc)[:120]}")
        else:
            print(f"{label}   {rate:10,.0f} chunks/s")
    clients, chunks, interval = args.paced_clients, args.paced_chunks, args.interval
    label = f"{name}, {clients:>3} paced clients x {chunks:>3}"
    try:
        rate, delays = asyncio.run(paced_rate(url, clients, chunks, interval))
    except (RuntimeError, AssertionError, httpx.HTTPError) as exc:
        print(f"{label}   failed: {str(exc)[:120]}")
        return
    print(f"{label}   {rate:10,.0f} chunks/s")
    report(f"{name}, paced", delays, "chunk delay")


def embedded(args: argparse.Namespace) -> None:
    port = free_port()
    proc = spawn(["serve", str(AGENTS), "--port", str(port)], {})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        first_token_delays(url, 10)  # warm up
        report("embedded", first_token_delays(url, args.turns))
        rates("embedded", url, args)
    finally:
        proc.terminate()
        proc.wait(20)


def split(args: argparse.Namespace) -> None:
    tag = uuid.uuid4().hex[:8].upper()
    env = {
        "AK_EXECUTION__QUEUES__TYPE": "nats",
        "AK_EXECUTION__QUEUES__NATS__INPUT_STREAM": f"BENCH_IN_{tag}",
        "AK_EXECUTION__QUEUES__NATS__INPUT_SUBJECT_PREFIX": f"bench{tag}.in",
        "AK_EXECUTION__QUEUES__NATS__OUTPUT_STREAM": f"BENCH_OUT_{tag}",
        "AK_EXECUTION__QUEUES__NATS__OUTPUT_SUBJECT_PREFIX": f"bench{tag}.out",
        "AK_EXECUTION__QUEUES__NATS__AUTO_PROVISION": "true",
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "redis",
        "AK_EXECUTION__RESPONSE_STORE__REDIS__URL": "redis://127.0.0.1:6379/0",
        "AK_EXECUTION__RESPONSE_STORE__REDIS__PREFIX": f"bench:{tag}:",
        "AK_SESSION__TYPE": "redis",  # a runner refuses a session store of its own
        "AK_SESSION__REDIS__URL": "redis://127.0.0.1:6379/0",
        "AK_SESSION__REDIS__PREFIX": f"bench:{tag}:",
    }
    port = free_port()
    io = spawn(["io", "--port", str(port)], env)
    url = f"http://127.0.0.1:{port}"
    runner = None
    try:
        wait_healthy(url)
        runner = spawn(["runner", str(AGENTS)], env)
        first_token_delays(url, 10)
        report("split (NATS + Redis)", first_token_delays(url, args.turns))
        rates("split", url, args)
    finally:
        for proc in (runner, io):
            if proc is not None:
                proc.terminate()
                proc.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--paced-clients", type=int, default=100)
    parser.add_argument("--paced-chunks", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between chunks")
    parser.add_argument("--split", action="store_true", help="also run IO + runner on NATS")
    parser.add_argument("--no-embedded", action="store_true", help="run only the split half")
    parser.add_argument("--log-dir", type=Path, help="keep the servers' output there")
    args = parser.parse_args()
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        LOG_DIR.append(args.log_dir)
    if not args.no_embedded:
        embedded(args)
    if args.split:
        split(args)


if __name__ == "__main__":
    main()
