"""The README's commands, run as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "agentkernel"]


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


# -- SIGTERM: nothing accepted is dropped in silence, no caller is cut off ---------------------


def start(command: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*CLI, *command, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    wait_healthy(f"http://127.0.0.1:{port}", proc)
    return proc


def stop(proc: subprocess.Popen[str], timeout: float = 40) -> str:
    """SIGTERM, then wait for the drain to end the process; returns its stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"process did not exit after SIGTERM:\n{err}") from None
    return err


def accepted(url: str, session: str, seconds: float, n: int) -> list[str]:
    """Queue ``n`` turns of the 'timed' agent on one session; returns their request ids."""
    ids = []
    for i in range(n):
        response = httpx.post(
            url + "/api/v1/chat",
            json={"session_id": session, "prompt": str(i), "agent": "timed", "seconds": seconds},
            headers={"Prefer": "respond-async"},
            timeout=10,
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["request_id"])
    return ids


def test_embedded_sigterm_runs_the_turns_already_accepted(tmp_path: Path) -> None:
    port, runs = free_port(), tmp_path / "runs.log"
    proc = start(["serve", "tests/e2e/ecs_test_runner.py"], port, {"E2E_RUN_LOG": str(runs)})
    try:
        ids = accepted(f"http://127.0.0.1:{port}", "queued", 0.4, 3)
        err = stop(proc)  # at once: one turn is running, two are still queued
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    ran = [line.split()[0] for line in runs.read_text().splitlines()]
    assert ran == ids  # before: only the first ran; the other two vanished with exit 0
    assert "not run before shutdown" not in err


def wait_for_depth(url: str, depth: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (
        f'agentkernel_queue_depth{{queue="input"}} {depth}' not in httpx.get(url + "/metrics").text
    ):
        assert time.monotonic() < deadline, "the turns were not queued in time"
        time.sleep(0.05)


def test_embedded_sigterm_logs_each_turn_it_could_not_run_and_answers_its_caller(
    tmp_path: Path,
) -> None:
    port, runs = free_port(), tmp_path / "runs.log"
    env = {"E2E_RUN_LOG": str(runs), "AK_EXECUTION__RUNNER__DRAIN_TIMEOUT": "0.5"}
    proc = start(["serve", "tests/e2e/ecs_test_runner.py"], port, env)
    url = f"http://127.0.0.1:{port}"
    waiting: list[httpx.Response] = []
    body = {"session_id": "long", "prompt": "sync", "agent": "timed", "seconds": 5}
    caller = threading.Thread(
        target=lambda: waiting.append(httpx.post(url + "/api/v1/chat", json=body, timeout=30))
    )
    try:
        ids = accepted(url, "long", 5, 3)
        caller.start()
        wait_for_depth(url, 3)  # the sync turn is queued behind two others (one runs)
        err = stop(proc)
        caller.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    lost = [line for line in err.splitlines() if "before shutdown (delivery" in line]
    sync_id = waiting[0].json()["request_id"]
    for request_id in [*ids, sync_id]:  # one line each, none dropped in silence
        assert sum(request_id in line for line in lost) == 1, err
    assert sum("was cut short" in line for line in lost) == 1, err  # the one that was running
    assert waiting[0].status_code == 503
    assert waiting[0].json()["error"] == "SHUTTING_DOWN"


def nats_env(tag: str, nats_url: str, redis_url: str) -> dict[str, str]:
    return {
        "AK_EXECUTION__QUEUES__TYPE": "nats",
        "AK_EXECUTION__QUEUES__NATS__URL": nats_url,
        "AK_EXECUTION__QUEUES__NATS__INPUT_STREAM": f"CLI_IN_{tag}",
        "AK_EXECUTION__QUEUES__NATS__INPUT_SUBJECT_PREFIX": f"cli{tag}.in",
        "AK_EXECUTION__QUEUES__NATS__OUTPUT_STREAM": f"CLI_OUT_{tag}",
        "AK_EXECUTION__QUEUES__NATS__OUTPUT_SUBJECT_PREFIX": f"cli{tag}.out",
        "AK_EXECUTION__QUEUES__NATS__PARTITIONS": "2",
        "AK_EXECUTION__QUEUES__NATS__AUTO_PROVISION": "true",
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "redis",
        "AK_EXECUTION__RESPONSE_STORE__REDIS__URL": redis_url,
        "AK_EXECUTION__RESPONSE_STORE__REDIS__PREFIX": f"cli:{tag}:",
        "AK_SESSION__TYPE": "redis",
        "AK_SESSION__REDIS__URL": redis_url,
        "AK_SESSION__REDIS__PREFIX": f"cli:{tag}:session:",
        "AK_API__SHUTDOWN_TIMEOUT": "1",
    }


@pytest.mark.nats
@pytest.mark.redis
def test_io_sigterm_answers_a_waiting_sync_caller_with_where_to_poll(
    nats_url: str, redis_url: str
) -> None:
    pytest.importorskip("nats")
    pytest.importorskip("redis")
    env = nats_env(uuid.uuid4().hex[:8].upper(), nats_url, redis_url)
    port = free_port()
    io = start(["io"], port, env)
    replies: list[httpx.Response] = []
    body = {"session_id": "io-drain", "prompt": "hello", "agent": "timed"}
    caller = threading.Thread(
        target=lambda: replies.append(
            httpx.post(f"http://127.0.0.1:{port}/api/v1/chat", json=body, timeout=30)
        )
    )
    try:
        caller.start()
        time.sleep(1.0)  # the turn is queued; no runner is up, so the caller waits
        signalled = time.monotonic()
        err = stop(io)
        caller.join(30)
        assert time.monotonic() - signalled < 10
    finally:
        if io.poll() is None:
            io.kill()
            io.communicate(timeout=10)
    assert io.returncode == 0, err
    response = replies[0]  # before: a bare disconnect (httpx.RemoteProtocolError)
    doc = response.json()
    assert (response.status_code, doc["error"]) == (503, "SHUTTING_DOWN")
    location = response.headers["location"]
    assert location == f"/api/v1/chat/io-drain?request_id={doc['request_id']}"

    # The Location resolves once a runner has run the turn, through any IO process.
    runner = subprocess.Popen(
        [*CLI, "runner", "tests/e2e/ecs_test_runner.py"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    port = free_port()
    io = start(["io"], port, env)
    try:
        deadline = time.monotonic() + 30
        while (
            reply := httpx.get(f"http://127.0.0.1:{port}{location}", timeout=5)
        ).status_code == 404:
            assert time.monotonic() < deadline, "the queued turn never ran"
            time.sleep(0.2)
        assert reply.status_code == 200 and "hello" in reply.json()["result"]
    finally:
        for proc in (io, runner):
            stop(proc)
