"""What a process writes to standard error, run as the real ``agentkernel`` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import servers

ROOT = Path(__file__).resolve().parents[2]
AGENTS = Path(__file__).with_name("agents.py")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Served:
    """``agentkernel serve`` of the test agents, with its standard error kept."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        self.port = servers.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "agentkernel", "serve", str(AGENTS), "--port"]
        self.proc = subprocess.Popen(
            [*command, str(self.port), *flags],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("the server did not start")

    def chat(self, prompt: str, agent: str = "slow", **headers: str) -> httpx.Response:
        body = {"session_id": "s1", "prompt": prompt, "agent": agent}
        return httpx.post(self.url + "/api/v1/chat", json=body, headers=headers, timeout=60)

    def interrupt(self) -> str:
        """Ctrl-C; returns what the process wrote to standard error."""
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for one in started:
        one.kill()


def test_json_lines_name_the_turns_request_session_and_trace(served: list[Served]) -> None:
    server = Served(env={"AK_LOGGING__FORMAT": "json"})
    served.append(server)
    reply = server.chat("0", traceparent=TRACEPARENT)
    assert reply.status_code == 200, reply.text
    lines = [json.loads(line) for line in server.interrupt().splitlines()]
    (turn,) = [doc for doc in lines if doc["logger"] == "agentkernel.turns"]
    assert turn["level"] == "INFO"
    assert turn["request_id"] == reply.json()["request_id"]
    assert turn["session_id"] == "s1"
    assert turn["trace_id"] == TRACE_ID
    assert " (agent slow, attempt 1) succeeded in 0.0" in turn["message"]


def test_the_log_level_flag_sets_the_agentkernel_loggers(served: list[Served]) -> None:
    quiet = Served("--log-level", "warning")
    served.append(quiet)
    assert quiet.chat("0").status_code == 200
    assert " INFO " not in quiet.interrupt()
    bad = subprocess.run(
        [sys.executable, "-m", "agentkernel", "serve", str(AGENTS), "--log-level", "loud"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--log-level" in bad.stderr


def test_a_retryable_error_is_one_warning_line_without_a_traceback(served: list[Served]) -> None:
    server = Served(env={"AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT": "2"})
    served.append(server)
    reply = server.chat("x", agent="flaky")
    assert reply.status_code == 500, reply.text
    err = server.interrupt()
    assert "Traceback" not in err
    (warning,) = [line for line in err.splitlines() if "asked to be retried" in line]
    assert " WARNING " in warning and "the model is overloaded" in warning


def test_a_clean_ctrl_c_logs_no_error(served: list[Served]) -> None:
    server = Served()
    served.append(server)
    assert server.chat("0").status_code == 200
    err = server.interrupt()
    assert " ERROR " not in err and "Traceback" not in err
    assert "drain finished; exiting with status 0" in err


def test_the_drain_states_true_numbers_and_a_cut_turn_is_told_so(served: list[Served]) -> None:
    server = Served(env={"AK_EXECUTION__RUNNER__DRAIN_TIMEOUT": "2"})
    served.append(server)
    replies: list[httpx.Response] = []
    caller = threading.Thread(target=lambda: replies.append(server.chat("30")))
    caller.start()
    deadline = time.monotonic() + 10
    while "agentkernel_turns_in_flight 1" not in httpx.get(server.url + "/metrics").text:
        assert time.monotonic() < deadline, "the turn did not start"
        time.sleep(0.05)
    err = server.interrupt()
    caller.join(30)
    (drain,) = [line for line in err.splitlines() if "drain of input" in line]
    waited = float(drain.split("still unfinished after ")[1].split("s;")[0])
    assert 2.0 <= waited < 4.0, drain
    assert replies[0].status_code == 503
    assert "while this turn was running" in replies[0].json()["message"]
    assert "before this turn could run" not in err


def test_json_access_lines_carry_the_turns_request_and_session(served: list[Served]) -> None:
    server = Served(env={"AK_LOGGING__FORMAT": "json", "AK_API__ACCESS_LOG": "true"})
    served.append(server)
    reply = server.chat("0")
    assert reply.status_code == 200, reply.text
    request_id = reply.json()["request_id"]
    poll = httpx.get(f"{server.url}/api/v1/chat/s1", params={"request_id": request_id})
    assert poll.status_code == 200, poll.text
    lines = [json.loads(line) for line in server.interrupt().splitlines()]
    access = [doc for doc in lines if doc["logger"] == "agentkernel.access"]
    chat = [doc for doc in access if "/api/v1/chat" in doc["message"]]
    assert len(chat) == 2, access
    assert all((d.get("request_id"), d.get("session_id")) == (request_id, "s1") for d in chat)
    health = [doc for doc in access if '"GET /health"' in doc["message"]]
    assert health and all("request_id" not in d and "session_id" not in d for d in health)
