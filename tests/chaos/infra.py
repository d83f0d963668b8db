"""Private servers a scenario can stop and start: Redis, NATS and PostgreSQL on ports of their own.

Each keeps its data on disk across a restart (Redis: append-only file synced on every write;
NATS: JetStream file store; PostgreSQL: its data directory, fsync on), so an outage makes them
unreachable without wiping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests import servers, session_servers

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
        try:
            binary = session_servers.redis_binary()  # the session's kind: Redis, else Valkey
        except RuntimeError as exc:
            servers.unavailable(str(exc))
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


class PrivatePostgres(PrivateServer):
    """A PostgreSQL cluster of its own (``initdb``), trust auth on 127.0.0.1, durable defaults.

    PostgreSQL refuses to run as root, so as root every server command runs as the ``postgres``
    user. Its data directory is one that user owns outside ``directory``: pytest's temporary
    directories are private to their owner, so that user could not reach one inside. Its log is
    copied into ``directory`` when it is closed, and the data directory deleted.
    """

    name = "postgres"
    #: Connections: each process opens a pool per component (10 each at most) and two listening
    #: connections; the walkthrough's sizing for five processes and a replacement or two.
    MAX_CONNECTIONS = 300

    def __init__(self, directory: Path) -> None:
        self.bin = _postgres_bin()
        self.home = Path(tempfile.mkdtemp(prefix="ak-chaos-pg-"))
        self.data = self.home / "data"
        if os.geteuid() == 0:
            shutil.chown(self.home, "postgres", "postgres")
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        super().__init__(directory)

    def _pg(self, tool: str, *args: str, check: bool = True) -> int:
        as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        log = (self.home / "tools.log").open("a")
        try:
            done = subprocess.run(
                [*as_owner, str(self.bin / tool), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=START_TIMEOUT + 5,
                check=check,
            )
        finally:
            log.close()
        return done.returncode

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.home} "
            f"-c max_connections={self.MAX_CONNECTIONS}"
        )
        log = str(self.home / "postgres.log")
        timeout = str(int(START_TIMEOUT))
        data = str(self.data)
        self._pg("pg_ctl", "-D", data, "-l", log, "-o", options, "-w", "-t", timeout, "start")

    def stop(self) -> None:
        """Fast shutdown: open sessions are ended, the data is kept (``pg_ctl stop -m fast``)."""
        if (self.data / "postmaster.pid").exists():
            self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def close(self) -> None:
        """Stop the server, keep its log in ``directory``, delete its data."""
        self.stop()
        for log in ("postgres.log", "tools.log"):
            if (self.home / log).exists():
                shutil.copy(self.home / log, self.dir / log)
        shutil.rmtree(self.home, ignore_errors=True)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


def _postgres_bin() -> Path:
    """The directory of ``initdb`` and ``pg_ctl`` (Debian keeps them off ``PATH``)."""
    found = shutil.which("initdb") or shutil.which("pg_ctl")
    if found is not None:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=_major)
    if not versions:
        servers.unavailable("no initdb/pg_ctl to start a private PostgreSQL")
    return versions[-1].parent


def _major(initdb: Path) -> int:
    version = initdb.parent.parent.name
    return int(version) if version.isdigit() else 0
