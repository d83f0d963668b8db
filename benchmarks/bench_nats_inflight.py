"""NATS turns in flight: sessions sending 1 s turns in a closed loop, code versions side by side.

Issue 30 §1: with one message per partition in flight for the whole deployment, 200 sessions
sending 1 s turns got 30 turns/s whatever the number of runners (32 partitions / 1 s). This
starts ``agentkernel io`` and N ``agentkernel runner`` processes on NATS + Redis with the
defaults (32 partitions, ``max_in_flight`` unset), an agent that awaits ``--turn`` seconds, and
drives ``--sessions`` sessions for ``--duration`` seconds, each posting its next ``rest_sync`` turn
when the reply is in. The ideal is ``sessions / turn`` turns/s.

Each ``--code`` entry is ``label=path-to-a-src-directory`` (put first on ``PYTHONPATH`` of the
processes; ``label=`` alone runs the installed package), so the code before and after a change
is measured interleaved in one run, on one nats-server and one Redis started here:

  git archive <base> src | tar -x -C /tmp/base
  python benchmarks/bench_nats_inflight.py --code before=/tmp/base/src,after=src \\
      [--runners 1,2] [--sessions 200,60] [--turn 1.0] [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scaleout import (
    Result,
    Servers,
    cpu_seconds,
    free_port,
    machine_busy,
    session_loop,
    wait_healthy,
)

HERE = Path(__file__).resolve().parent
AGENTS = HERE / "_inflight_agents.py"


def config(servers: Servers, tag: str) -> dict[str, Any]:
    redis = {"url": servers.redis_url, "prefix": f"nif:{tag}:"}
    return {
        "execution": {
            "mode": "rest_sync",
            "queues": {
                "type": "nats",
                "nats": {
                    "url": servers.nats_url,
                    "input_stream": f"NIF_IN_{tag}",
                    "input_subject_prefix": f"nif{tag}.in",
                    "output_stream": f"NIF_OUT_{tag}",
                    "output_subject_prefix": f"nif{tag}.out",
                    "auto_provision": True,
                },
            },
            "response_store": {"type": "redis", "redis": redis},
        },
        "session": {"type": "redis", "redis": redis},
        "logging": {"ak": {"level": "WARNING"}},
    }


async def drive(port: int, sessions: int, seconds: float, tag: str) -> list[tuple[float, int]]:
    """(latency, status) of the turns answered within ``seconds``."""
    out: list[Result] = []
    until = asyncio.get_running_loop().time() + seconds
    turns = (session_loop(port, f"{tag}-{i}", until, out, "turn") for i in range(sessions))
    await asyncio.gather(*turns)
    return [(latency, status) for latency, status, answered in out if answered <= until]


def spawn(args: list[str], log: Path, src: str, turn: float) -> subprocess.Popen[bytes]:
    env = dict(os.environ, AK_BENCH_TURN_SECONDS=str(turn))
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def measure(servers: Servers, src: str, runners: int, sessions: int, args: Any) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8].upper()
    cfg = servers.workdir / f"config-{tag}.json"
    cfg.write_text(json.dumps(config(servers, tag)))
    port = free_port()
    cli = [sys.executable, "-m", "agentkernel"]
    io = spawn(
        [*cli, "io", "--config", str(cfg), "--port", str(port)],
        servers.workdir / f"io-{tag}.log",
        src,
        args.turn,
    )
    procs = [io]
    try:
        wait_healthy(f"http://127.0.0.1:{port}", io)
        for i in range(runners):
            log = servers.workdir / f"runner-{tag}-{i}.log"
            procs.append(
                spawn([*cli, "runner", str(AGENTS), "--config", str(cfg)], log, src, args.turn)
            )
        asyncio.run(drive(port, sessions, 3.0 + 2 * args.turn, "warm"))  # every runner in
        pids = [p.pid for p in procs] + [servers.procs["broker"].pid, servers.procs["redis"].pid]
        io_before = cpu_seconds(io.pid)
        cpu_before, busy_before = sum(map(cpu_seconds, pids)), machine_busy()
        client_before = time.process_time()
        results = asyncio.run(drive(port, sessions, args.duration, uuid.uuid4().hex[:6]))
        cpu = sum(map(cpu_seconds, pids)) - cpu_before
        io_cpu = cpu_seconds(io.pid) - io_before
        client = time.process_time() - client_before
        busy_after = machine_busy()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
    ok = sorted(lat for lat, status in results if status == 200)
    return {
        "runners": runners,
        "sessions": sessions,
        "turns_per_s": len(ok) / args.duration,
        "ideal": sessions / args.turn,
        "errors": len(results) - len(ok),
        "p50": statistics.median(ok) if ok else float("nan"),
        "p99": ok[int(0.99 * (len(ok) - 1))] if ok else float("nan"),
        "cpu_ms_per_turn": 1000 * cpu / max(len(ok), 1),
        "ours_cores": (cpu + client) / args.duration,  # with the load generator
        "io_cores": io_cpu / args.duration,
        "machine_busy": (busy_after[0] - busy_before[0]) / max(busy_after[1] - busy_before[1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", default="installed=", help="label=src-dir,... (see above)")
    parser.add_argument("--runners", default="1,2")
    parser.add_argument("--sessions", default="200,60")
    parser.add_argument("--turn", type=float, default=1.0, help="seconds the agent awaits")
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    codes = [entry.split("=", 1) for entry in args.code.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ak-inflight-") as tmp:
        servers = Servers(Path(tmp))
        servers.start_redis()
        servers.start_nats()
        try:
            for sessions in (int(n) for n in args.sessions.split(",")):
                for runners in (int(n) for n in args.runners.split(",")):
                    for label, src in codes:  # versions interleaved: the host's load drifts
                        row = {"code": label} | measure(servers, src, runners, sessions, args)
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            servers.stop()
    print(f"{args.turn:g} s turns, {args.duration:.0f} s per point, defaults (32 partitions)\n")
    print(
        "| code | sessions | runners | turns/s | x ideal | p50 s | p99 s | errors | CPU ms/turn "
        "| ours + client, cores | IO, cores | machine busy % |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['code']} | {r['sessions']} | {r['runners']} | {r['turns_per_s']:.0f} | "
            f"{r['turns_per_s'] / r['ideal']:.2f} | {r['p50']:.2f} | {r['p99']:.2f} | "
            f"{r['errors']} | {r['cpu_ms_per_turn']:.1f} | {r['ours_cores']:.2f} | "
            f"{r['io_cores']:.2f} | {100 * r['machine_busy']:.0f} |"
        )


if __name__ == "__main__":
    main()
