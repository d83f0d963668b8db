"""Running the installed ``agentkernel`` command (the console script, not ``python -m``, whose
working folder is importable anyway) and reading its one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

AGENTKERNEL = str(Path(sys.executable).with_name("agentkernel"))

ECHO_AGENT = (
    "from agentkernel import Agent, Module\n"
    "Module([Agent('echo', lambda turn: 'echo ' + turn.prompt)])\n"
)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``AK_`` settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AK_")}
    return env | extra


def run(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):  # type: ignore[no-untyped-def]
    return subprocess.run(
        [AGENTKERNEL, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else clean_env(),
    )


def one_line_error(done: subprocess.CompletedProcess[str], text: str) -> str:
    """The command failed with exit 2 and one ``agentkernel:`` line holding ``text``."""
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("agentkernel: ")]
    assert len(errors) == 1 and text in errors[0], done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return errors[0]


def start(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [AGENTKERNEL, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env if env is not None else clean_env(),
        start_new_session=True,
    )


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1])
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("server did not become healthy")


def stop(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """SIGTERM the process (and, for ``--reload``, its child), return its stderr."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate(timeout=10)[1]
