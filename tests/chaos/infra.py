"""Private servers a scenario can stop and start: Redis and NATS on ports of their own.

Both keep their data on disk across a restart (Redis: append-only file synced on every write;
NATS: JetStream file store), so an outage makes them unreachable without wiping them.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests import servers

START_TIMEOUT = 15.0
STOP_TIMEOUT = 15.0


class PrivateServer:
    """A server process on its own port that can be stopped and started again."""

    name = "server"

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = servers.free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        log = (self.dir / f"{self.name}.log").open("a")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not servers.port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} on port {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        """Graceful stop (SIGTERM); SIGKILL when it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)


class PrivateRedis(PrivateServer):
    """redis-server with an append-only file synced on every write."""

    name = "redis"

    def command(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            servers.unavailable("no redis-server binary to start a private Redis")
        return [
            str(binary),
            "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class PrivateNats(PrivateServer):
    """nats-server with JetStream on a file store."""

    name = "nats"

    def __init__(self, directory: Path) -> None:
        self.monitor_port = servers.free_port()  # /jsz, read by tests/chaos/trace.py
        super().__init__(directory)

    def command(self) -> list[str]:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        if not Path(binary).exists():
            servers.unavailable("no nats-server binary to start a private server")
        store = self.dir / "js"
        return [
            binary, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(self.port),
            "-m", str(self.monitor_port),
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"


class EphemeralRedis(PrivateRedis):
    """redis-server without persistence: a restart comes back empty (Debian's default setup)."""

    def command(self) -> list[str]:
        durable = super().command()
        return [*durable[: durable.index("--save")], "--save", "", "--appendonly", "no"]
