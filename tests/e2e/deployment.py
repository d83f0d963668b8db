"""Helpers to run the IO process and runner processes with the ``agentkernel`` command."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests import servers

ROOT = Path(__file__).resolve().parents[2]
AGENTS = Path(__file__).with_name("ecs_test_runner.py")


class Deployment:
    """An IO process (``agentkernel io``) plus runner processes (``agentkernel runner``).

    Args:
        env: configuration of every process (``AK_`` variables).
        log_dir: write each process's stderr to its own file there (``<role>-<n>.log``), so a
            chatty process never blocks on a full pipe and its lines can be counted; default:
            a pipe, read when the deployment closes.
    """

    def __init__(self, env: dict[str, str], log_dir: Path | None = None) -> None:
        self.tag = uuid.uuid4().hex[:10]
        self.run_log = Path(os.environ.get("TMPDIR", "/tmp")) / f"runs-{self.tag}.log"
        self.log_dir = log_dir
        self.logs: list[Path] = []
        self.env = {
            "PATH": os.environ["PATH"],
            # This checkout's sources first, whatever the virtualenv has installed.
            "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
            "E2E_RUN_LOG": str(self.run_log),
            **env,
        }
        self.port = servers.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[str]] = []
        self.client = httpx.Client(base_url=self.url, timeout=30)
        self.io: subprocess.Popen[str] | None = None

    def start_io(self, agents: Path | None = None) -> None:
        """Start the IO process; with ``agents``, the embedded server (``serve``) instead."""
        command = ("serve", str(agents)) if agents is not None else ("io",)
        self.io = self.spawn(*command, "--port", str(self.port))
        self.wait_healthy()

    def wait_healthy(self) -> None:
        assert self.io is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.io.poll() is None, self.io.communicate()[1]
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("IO process did not start")

    def runner(
        self, agents: Path = AGENTS, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        return self.spawn("runner", str(agents), env=env)

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start ``agentkernel <args>``; ``env`` overrides some of the deployment's settings."""
        stderr: Any = subprocess.PIPE
        if self.log_dir is not None:
            log = self.log_dir / f"{args[0]}-{len(self.procs)}.log"
            self.logs.append(log)
            stderr = log.open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentkernel", *args],
            env=self.env | (env or {}),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
        if stderr is not subprocess.PIPE:
            stderr.close()  # the child has its own descriptor
        self.procs.append(proc)
        return proc

    def post(
        self, session: str, prompt: str, asynchronous: bool = False, **extra: object
    ) -> httpx.Response:
        headers = {"Prefer": "respond-async"} if asynchronous else {}
        body = {"session_id": session, "prompt": prompt, "agent": "timed", **extra}
        return self.client.post("/api/v1/chat", json=body, headers=headers)

    def poll(self, session: str, request_id: str, timeout: float = 30) -> httpx.Response:
        deadline = time.monotonic() + timeout
        while True:
            response = self.client.get(f"/api/v1/chat/{session}", params={"request_id": request_id})
            if response.status_code != 404 or time.monotonic() > deadline:
                return response
            time.sleep(0.1)

    def runs(self) -> list[str]:
        return self.run_log.read_text().split() if self.run_log.exists() else []

    def wait_started(self, request_id: str, timeout: float = 30) -> None:
        """Wait until a runner has started turn ``request_id`` (the run log names it): a runner
        that is still starting up on a loaded machine has not, however long a fixed sleep."""
        deadline = time.monotonic() + timeout
        while request_id not in self.runs():
            assert time.monotonic() < deadline, f"turn {request_id} did not start in {timeout}s"
            time.sleep(0.05)

    def close(self) -> None:
        self.client.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


def result(response: httpx.Response) -> dict[str, object]:
    assert response.status_code == 200, response.text
    return dict(json.loads(response.json()["result"]))


def assert_in_order_and_exclusive(turns: list[dict[str, object]]) -> None:
    assert [t["prompt"] for t in turns] == [str(i) for i in range(len(turns))]
    for before, after in itertools.pairwise(turns):
        assert float(after["start"]) >= float(before["end"]), f"turns overlapped: {turns}"  # type: ignore[arg-type]
