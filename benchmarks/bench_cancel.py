"""Cancel latency: from ``POST .../cancel`` to the running agent stopping, and to the caller
holding the final ``CANCELLED`` reply.

For each of ``--turns`` turns (one session each, one at a time): enqueue a turn of an agent that
works for a minute, wait until it has started, send the cancel, and record

- *stopped*: when the agent got its ``CancelledError`` (the agent notes the wall clock; same
  machine, so the clocks agree), less when the cancel was sent;
- *answered*: when the cancel's 200 arrived (it answers once the turn's ``CANCELLED`` reply is
  stored, so any waiting caller has it by then), less when it was sent.

Embedded (``agentkernel serve``) and split (``agentkernel io`` + ``agentkernel runner`` on NATS
JetStream, Redis replies and sessions; the cancel goes to a second IO process, not the one
that accepted the turn). Defaults everywhere (``execution.turn_control.poll_interval`` 0.25 s).

Usage: python benchmarks/bench_cancel.py [--turns 50] [--split]
(--split needs NATS on 127.0.0.1:4222 and Redis on 127.0.0.1:6379.)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from bench_streaming import free_port, spawn, wait_healthy

HERE = Path(__file__).parent
AGENTS = HERE / "_cancel_agents.py"


def noted(log: Path, kind: str, request_id: str, timeout: float = 30) -> float:
    """The wall-clock time the agent noted ``kind`` for ``request_id``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists():
            for line in log.read_text().splitlines():
                what, rid, at = line.split()
                if (what, rid) == (kind, request_id):
                    return float(at)
        time.sleep(0.005)
    raise RuntimeError(f"the agent never noted {kind} of {request_id}")


def measure(accept_url: str, cancel_url: str, log: Path, turns: int) -> tuple[list[float], ...]:
    stopped, answered = [], []
    with (
        httpx.Client(base_url=accept_url, timeout=30) as accept,
        httpx.Client(base_url=cancel_url, timeout=30) as cancel,
    ):
        for _ in range(turns):
            session = f"b-{uuid.uuid4().hex[:8]}"
            body = {"session_id": session, "prompt": "x", "agent": "hold"}
            posted = accept.post("/api/v1/chat", json=body, headers={"Prefer": "respond-async"})
            request_id = posted.json()["request_id"]
            noted(log, "start", request_id)
            time.sleep(0.05)
            sent = time.time()
            response = cancel.post(
                f"/api/v1/chat/{session}/cancel", params={"request_id": request_id}
            )
            answered.append(time.time() - sent)
            assert response.status_code == 200, response.text
            stopped.append(noted(log, "cancelled", request_id) - sent)
    return stopped, answered


def report(name: str, values: list[float]) -> None:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(
        f"{name:<34} p50 {statistics.median(ms):7.1f} ms   p99 {p99:7.1f} ms   "
        f"max {ms[-1]:7.1f} ms   (n={len(ms)})"
    )


def embedded(turns: int, log: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn(["serve", str(AGENTS), "--port", str(port)], {"CANCEL_LOG": str(log)})
    try:
        wait_healthy(url)
        stopped, answered = measure(url, url, log, turns)
    finally:
        proc.terminate()
        proc.wait(30)
    report("embedded: cancel -> agent stopped", stopped)
    report("embedded: cancel -> caller answered", answered)


def split(turns: int, log: Path) -> None:
    tag = uuid.uuid4().hex[:8].upper()
    redis = "redis://127.0.0.1:6379/0"
    env = {
        "CANCEL_LOG": str(log),
        "AK_EXECUTION__QUEUES__TYPE": "nats",
        "AK_EXECUTION__QUEUES__NATS__INPUT_STREAM": f"BENCH_IN_{tag}",
        "AK_EXECUTION__QUEUES__NATS__INPUT_SUBJECT_PREFIX": f"bench{tag}.in",
        "AK_EXECUTION__QUEUES__NATS__OUTPUT_STREAM": f"BENCH_OUT_{tag}",
        "AK_EXECUTION__QUEUES__NATS__OUTPUT_SUBJECT_PREFIX": f"bench{tag}.out",
        "AK_EXECUTION__QUEUES__NATS__AUTO_PROVISION": "true",
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "redis",
        "AK_EXECUTION__RESPONSE_STORE__REDIS__URL": redis,
        "AK_EXECUTION__RESPONSE_STORE__REDIS__PREFIX": f"bench:{tag}:",
        "AK_SESSION__TYPE": "redis",
        "AK_SESSION__REDIS__URL": redis,
        "AK_SESSION__REDIS__PREFIX": f"bench:{tag}:session:",
    }
    ports = free_port(), free_port()
    procs = [spawn(["io", "--port", str(p)], env) for p in ports]
    procs.append(spawn(["runner", str(AGENTS)], env))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in urls:
            wait_healthy(url)
        time.sleep(1.0)  # the runner connects
        stopped, answered = measure(urls[0], urls[1], log, turns)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    report("split: cancel -> agent stopped", stopped)
    report("split: cancel -> caller answered", answered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--split", action="store_true", help="also measure the split topology")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        embedded(args.turns, Path(folder) / "embedded.log")
        if args.split:
            split(args.turns, Path(folder) / "split.log")


if __name__ == "__main__":
    main()
