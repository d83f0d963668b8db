"""Streaming across processes: NATS carries the chunks, Redis fans them out to every IO process."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import servers
from tests.e2e.deployment import Deployment
from tests.e2e.test_nats import nats_env

pytestmark = [pytest.mark.nats, pytest.mark.redis, pytest.mark.slow]

AGENTS = Path(__file__).with_name("stream_runner.py")


@pytest.fixture
def deployment(nats_url: str, redis_url: str) -> Iterator[Deployment]:
    d = Deployment({})
    d.env |= nats_env(nats_url, redis_url, d.tag)
    d.start_io()
    yield d
    d.close()


def second_io(d: Deployment) -> str:
    port = servers.free_port()
    d.spawn("io", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("second IO process did not start")


def stream(
    url: str, body: dict[str, Any], timeout: float = 60
) -> list[tuple[dict[str, Any], float]]:
    frames = []
    with httpx.stream(
        "POST",
        f"{url}/api/v1/chat",
        json=body,
        headers={"Accept": "text/event-stream"},
        timeout=timeout,
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                frames.append((json.loads(line[6:]), time.monotonic()))
    return frames


def runner(d: Deployment) -> subprocess.Popen[str]:
    return d.spawn("runner", str(AGENTS))


def test_chunks_reach_a_client_of_another_io_process_live_and_in_order(
    deployment: Deployment,
) -> None:
    d = deployment
    other = second_io(d)
    runner(d)
    for turn in range(3):  # both IO processes consume OUTPUT, so chunks are split between them
        body = {
            "session_id": f"x{turn}",
            "prompt": "go",
            "agent": "ticker",
            "count": 6,
            "tick": 0.2,
        }
        frames = stream(other if turn % 2 else d.url, body)
        chunks = [f for f, _ in frames if not f.get("done")]
        assert [c["index"] for c in chunks] == list(range(6))
        assert frames[-1][0]["result"] == "".join(f"c{i} " for i in range(6))
        assert frames[5][1] - frames[0][1] > 0.6, "chunks arrived all at once"


def test_a_turn_redelivered_after_kill_9_shows_no_duplicate_chunk(deployment: Deployment) -> None:
    d = deployment
    victim = runner(d)
    time.sleep(2)
    body = {"session_id": "k", "prompt": "go", "agent": "ticker", "count": 6, "tick": 0.5}
    with httpx.stream(
        "POST",
        f"{d.url}/api/v1/chat",
        json=body,
        headers={"Accept": "text/event-stream"},
        timeout=60,
    ) as r:
        frames = []
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            frames.append(json.loads(line[6:]))
            if len(frames) == 2 and victim.poll() is None:
                victim.send_signal(signal.SIGKILL)  # mid-stream
                victim.wait(10)
                runner(d)
    indexes = [f.get("index") for f in frames]
    assert indexes == [0, 1, 2, 3, 4, 5, None], indexes
    assert frames[-1]["result"] == "".join(f"c{i} " for i in range(6))
