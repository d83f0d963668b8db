"""The README's commands, run as real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "agentkernel"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("server did not become healthy")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_serve_chat_and_sigterm() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [*CLI, "serve", "examples/echo.py", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_healthy(url, proc)
        first = run("chat", "--url", url, "--session", "s", "hello")
        assert (first.returncode, first.stdout) == (0, "hello #1\n"), first.stderr
        second = run("chat", "--url", url, "--session", "s", "--async", "again")
        assert (second.returncode, second.stdout) == (0, "again #2\n"), second.stderr
        missing = run("chat", "--url", url, "--session", "s", "--agent", "nobody", "x")
        assert missing.returncode == 1 and "AGENT_NOT_FOUND" in missing.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


def test_serve_with_missing_agents_file_exits_2() -> None:
    result = run("serve", "no/such/agents.py")
    assert result.returncode == 2
    assert "cannot load agents from 'no/such/agents.py'" in result.stderr


def test_invalid_configuration_exits_2_and_names_the_key() -> None:
    env = {**os.environ, "AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS": "zero"}
    result = subprocess.run(
        [*CLI, "serve", "examples/echo.py"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 2
    assert "execution.queues.input.no_of_consumers" in result.stderr


def test_chat_without_a_server_fails_clearly() -> None:
    result = run("chat", "--url", f"http://127.0.0.1:{free_port()}", "--session", "s", "hi")
    assert result.returncode == 1 and "cannot reach" in result.stderr


def test_sigterm_finishes_the_turn_in_flight_then_exits_0() -> None:
    import threading

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agents = "tests/e2e/ecs_test_runner.py"  # defines the 'timed' agent
    proc = subprocess.Popen(
        [*CLI, "serve", agents, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    replies: list[httpx.Response] = []
    body = {"session_id": "drain", "prompt": "p", "agent": "timed", "seconds": 1.5}
    try:
        wait_healthy(url, proc)
        caller = threading.Thread(
            target=lambda: replies.append(httpx.post(url + "/api/v1/chat", json=body, timeout=30))
        )
        caller.start()
        time.sleep(0.5)  # the turn is running
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        late = httpx.post(url + "/api/v1/chat", json={**body, "seconds": 0}, timeout=5)
        assert (late.status_code, late.json()["error"]) == (503, "SHUTTING_DOWN")
        caller.join(30)
        _, err = proc.communicate(timeout=20)  # the drain ends the process by itself
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert [r.status_code for r in replies] == [200]
