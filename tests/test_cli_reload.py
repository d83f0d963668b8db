"""``agentkernel serve --reload``: the server restarts with the new code when a file changes."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.cli_helpers import start, stop, wait_healthy
from tests.servers import free_port

VERSION = (
    "from agentkernel import Agent, Module\nModule([Agent('v', lambda t: '{} ' + t.prompt)])\n"
)


def ask(url: str) -> str | None:
    try:
        answer = httpx.post(
            f"{url}/api/v1/chat", json={"session_id": "s", "prompt": "hi"}, timeout=5
        )
    except httpx.HTTPError:
        return None  # between two children
    return str(answer.json().get("result")) if answer.status_code == 200 else None


def test_serve_reload_runs_the_changed_agents_file(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(VERSION.format("v1"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["serve", "agents.py", "--port", str(port), "--reload"], tmp_path)
    try:
        wait_healthy(url, proc)
        assert ask(url) == "v1 hi"
        time.sleep(1.1)  # a later modification time than the first version's
        (tmp_path / "agents.py").write_text(VERSION.format("v2"))
        deadline = time.monotonic() + 30
        while (reply := ask(url)) != "v2 hi":
            assert time.monotonic() < deadline, f"still {reply!r}"
            time.sleep(0.3)
        (tmp_path / "agents.py").write_text("def broken(:\n")  # the child fails; the parent stays
        time.sleep(3)
        assert proc.poll() is None
    finally:
        err = stop(proc)
    assert "Reloading" in err and "agentkernel: cannot load agents from 'agents.py'" in err, err
    assert proc.returncode == 0, err
