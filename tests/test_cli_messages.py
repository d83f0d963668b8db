"""The command line's messages: one clear line and a non-zero exit for each start-up mistake."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agentkernel import __version__
from tests.servers import free_port


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agentkernel", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)


def one_line_error(done: subprocess.CompletedProcess[str], text: str) -> None:
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("agentkernel: ")]
    assert len(errors) == 1 and text in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_version(tmp_path: Path) -> None:
    done = run("--version", cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, f"agentkernel {__version__}")


def test_a_duplicate_agent_name(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(
        "from agentkernel import Agent, Module\n"
        "Module([Agent('a', str)])\nModule([Agent('a', repr)])\n"
    )
    one_line_error(run("serve", "agents.py", cwd=tmp_path), "an agent named 'a' is already")


def test_a_missing_config_file(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text("")
    done = run("serve", "agents.py", "--config", "nope.yaml", cwd=tmp_path)
    one_line_error(done, "config file 'nope.yaml' does not exist")


def test_split_processes_refuse_in_memory_queues(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text("")
    for args in (("io",), ("runner", "agents.py")):
        one_line_error(run(*args, cwd=tmp_path), "needs a broker shared with the other processes")


def test_a_port_out_of_range_or_a_directory_as_config(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text("")
    done = run("serve", "agents.py", "--port", "99999", cwd=tmp_path)
    assert done.returncode == 2 and "'99999' is not a port (0-65535)" in done.stderr
    assert "Traceback" not in done.stderr
    one_line_error(run("serve", "agents.py", "--config", ".", cwd=tmp_path), "is not a file")


def test_a_port_in_use(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text("")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("serve", "agents.py", "--port", str(port), cwd=tmp_path)
    one_line_error(done, f"api.port: cannot listen on 127.0.0.1:{port}")


def test_serve_prints_a_start_summary_and_with_access_log_one_line_per_request(
    tmp_path: Path,
) -> None:
    (tmp_path / "agents.py").write_text(
        "from agentkernel import Agent, Module\nModule([Agent('echo', lambda turn: turn.prompt)])\n"
    )
    port = free_port()
    command = [sys.executable, "-m", "agentkernel", "serve", "agents.py", "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--access-log"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None, "no server"
                time.sleep(0.1)
        reply = httpx.post(url + "/api/v1/chat", json={"session_id": "s", "prompt": "hi"})
        assert reply.status_code == 200
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=30)
    summary = f"agentkernel {__version__} serve on http://127.0.0.1:{port}: agents [echo], "
    assert summary + "transport in_memory, response store in_memory" in stderr, stderr
    request_id = reply.json()["request_id"]
    access = [line for line in stderr.splitlines() if "agentkernel.access" in line]
    assert any('"GET /health" 200 ' in line for line in access), stderr
    assert any(
        '"POST /api/v1/chat" 200 ' in line and f"request_id={request_id}" in line for line in access
    ), stderr
