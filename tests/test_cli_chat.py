"""``agentkernel chat`` against a real server: what it says when the reply does not come in
time, when the server cannot be reached, and where it finds the server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import clean_env, run, start, stop, wait_healthy
from tests.servers import free_port

SLOW_AGENT = """
import time
from pathlib import Path
from agentkernel import Agent, Module

def slow(turn):
    with Path('runs.log').open('a') as log:
        log.write(turn.request_id + '\\n')
    time.sleep(3)
    return 'slow ' + turn.prompt

Module([Agent('slow', slow)])
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("chat")
    (folder / "agents.py").write_text(SLOW_AGENT)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["serve", "agents.py", "--port", str(port)], folder)
    try:
        wait_healthy(url, proc)
        yield url, folder
    finally:
        stop(proc)


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("agentkernel: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_sync_turn_past_the_timeout_names_the_url_to_poll(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    url, folder = server
    done = run("chat", "--url", url, "--session", "t1", "--timeout", "1", "hi", cwd=tmp_path)
    assert done.returncode == 1
    line = error_line(done.stderr)  # before: "no reply within 1s", nothing to poll
    assert f"the turn is still running: poll {url}/api/v1/chat/t1?request_id=" in line
    request_id = line.rsplit("request_id=", 1)[1]
    time.sleep(3.5)  # the turn finishes; asking for its request id did not run it again
    runs = (folder / "runs.log").read_text().split()
    assert runs.count(request_id) == 1


def test_a_stream_past_the_timeout_does_not_blame_the_connection(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = server
    args = ("chat", "--url", url, "--session", "t2", "--timeout", "1", "--stream", "hi")
    done = run(*args, cwd=tmp_path)
    line = error_line(done.stderr)  # before: "cannot reach the server: timed out"
    assert done.returncode == 1 and "cannot reach" not in line
    assert f"no reply within 1s; the turn is still running: poll {url}/api/v1/chat/t2" in line


def test_the_server_url_comes_from_the_environment(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = server
    env = clean_env(AGENTKERNEL_URL=url)
    done = run("chat", "--session", "t3", "hello", cwd=tmp_path, env=env)
    assert (done.returncode, done.stdout) == (0, "slow hello\n"), done.stderr


def test_a_refused_connection_names_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for extra in ((), ("--stream",), ("--async",)):
        done = run(
            "chat", "--session", "s", *extra, "hi", cwd=tmp_path, env=clean_env(AGENTKERNEL_URL=url)
        )
        assert done.returncode == 1
        assert f"cannot reach the server at {url}: " in error_line(done.stderr)


@pytest.mark.parametrize(
    "bad", ["not a url", "ftp://x", "http://[::1", "http://", "http://h:99999"]
)
def test_a_malformed_server_url_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    for args, env in (
        (("--url", bad), clean_env()),
        ((), clean_env(AGENTKERNEL_URL=bad)),
    ):
        done = run("chat", "--session", "s", *args, "hi", cwd=tmp_path, env=env)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"{bad!r} is not a server URL" in done.stderr
