"""A response store outage, on a real Redis server that the test kills and brings back.

While Redis is down the API answers JSON 503 ``STORE_UNAVAILABLE`` at once, with the request id
and a Location to poll; the reply the runner produced waits on OUTPUT, retried with a growing
delay and a handful of log lines; once Redis is back the reply becomes readable.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("redis")  # the core CI stage runs tests/api without the redis extra

from agentkernel.pipeline.response_store.redis import RedisResponseStore
from tests import servers, session_servers

from .conftest import Server

pytestmark = pytest.mark.redis


class PrivateRedis:
    """A redis-server of this test alone, on a free port, that can be killed and restarted."""

    def __init__(self) -> None:
        try:
            binary = session_servers.redis_binary()  # the session's kind: Redis, else Valkey
        except RuntimeError as exc:
            servers.unavailable(str(exc))
        self.binary = binary or ""
        self.port = servers.free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        args = ["--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [self.binary, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not servers.port_open(self.port):
            assert time.monotonic() < deadline, "private redis-server did not start"
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    yield server
    server.kill()


def redeliveries(server: Server) -> int:
    text = server.client.get("/metrics").text
    found = re.search(r'agentkernel_redeliveries_total\{queue="output"\} (\d+)', text)
    return int(found.group(1)) if found else 0


def test_store_outage_answers_503_quickly_and_replies_land_when_it_is_back(
    start_server: Callable[..., Server],
    private_redis: PrivateRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RedisResponseStore(private_redis.url, prefix="outage:")
    server = start_server(store=store)
    assert server.client.post("/api/v1/chat", json={"session_id": "o", "prompt": "up"}).json()[
        "result"
    ] == ("up #1")
    caplog.set_level(logging.INFO, logger="agentkernel")
    private_redis.kill()

    started = time.monotonic()
    response = server.client.post("/api/v1/chat", json={"session_id": "o", "prompt": "down"})
    assert time.monotonic() - started < 2.0
    assert response.status_code == 503
    doc = response.json()  # JSON, not a plain-text 500
    assert doc["error"] == "STORE_UNAVAILABLE" and doc["session_id"] == "o"
    location = response.headers["location"]
    assert location == f"/api/v1/chat/o?request_id={doc['request_id']}"

    poll = server.client.get(location)
    assert (poll.status_code, poll.json()["error"]) == (503, "STORE_UNAVAILABLE")
    ready = server.client.get("/ready")
    assert (ready.status_code, ready.json()["response_store"]) == (
        503,
        "unavailable: StoreUnavailableError",
    )
    assert ready.json()["error"] == "NOT_READY" and "response_store" in ready.json()["message"]

    time.sleep(2.0)
    # Without back-off the reply was retried 276 times in 0.3 s; now 0.5 s, 1 s, 2 s ...
    assert redeliveries(server) <= 3
    flood = [r for r in caplog.records if r.name.startswith("agentkernel")]
    print(f"{redeliveries(server)} redeliveries, {len(flood)} log lines in the first 2 s")
    assert len(flood) <= 12, [r.getMessage() for r in flood]

    private_redis.start()
    deadline = time.monotonic() + 15
    while (reply := server.client.get(location)).status_code in (404, 503):
        assert time.monotonic() < deadline, reply.text
        time.sleep(0.1)
    assert (reply.status_code, reply.json()["result"]) == (200, "down #2")  # the real reply
