"""What a caller and a probe see when the Redis behind the stores loses data or fills up.

The embedded server keeps its sessions and its replies in one private redis-server without
persistence, as the split walkthrough used to start it. Emptied, the server must not answer a
session's next turn from an empty state, nor accept an idempotent retry it can never answer;
full, ``/ready`` must fail and a POST must be refused at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

redis = pytest.importorskip("redis")

from agentkernel.core.config.stores import RedisStoreConfig, SessionConfig  # noqa: E402
from agentkernel.pipeline.process.io_handler import IOHandler  # noqa: E402
from agentkernel.pipeline.response_store.redis import RedisResponseStore  # noqa: E402
from agentkernel.pipeline.runtime.metrics import METRICS  # noqa: E402
from tests.chaos.infra import EphemeralRedis  # noqa: E402

from .conftest import Server, make_config, poll, registry  # noqa: E402

pytestmark = pytest.mark.redis


@pytest.fixture
def private(tmp_path: Path) -> Iterator[EphemeralRedis]:
    server = EphemeralRedis(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
def admin(private: EphemeralRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(private.url, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def embedded(private: EphemeralRedis) -> Iterator[Server]:
    """The embedded server with both stores in the private Redis."""
    METRICS.reset()
    config = make_config()
    stores = RedisStoreConfig(url=private.url, prefix=f"api:{uuid.uuid4().hex[:6]}:")
    session = SessionConfig(type="redis", redis=stores)
    config = config.model_copy(update={"session": session})
    store = RedisResponseStore(private.url, prefix=stores.prefix)
    server = Server(IOHandler(config, registry(), store=store, with_runner=True))
    yield server
    server.close()


def chat(server: Server, session: str, prompt: str, **headers: str) -> httpx.Response:
    body: dict[str, Any] = {"session_id": session, "prompt": prompt, "agent": "echo"}
    return server.client.post("/api/v1/chat", json=body, headers=headers)


def until(call: Callable[[], httpx.Response], done: Callable[[httpx.Response], bool]) -> Any:
    deadline = time.monotonic() + 15
    while not done(response := call()):
        assert time.monotonic() < deadline, response.text
        time.sleep(0.1)
    return response


def test_a_wiped_store_refuses_the_next_turn_instead_of_starting_over(
    embedded: Server, admin: redis.Redis
) -> None:
    assert chat(embedded, "s", "a").json()["result"] == "a #1"
    assert chat(embedded, "s", "b").json()["result"] == "b #2"
    admin.flushall()
    refused = chat(embedded, "s", "c")
    assert refused.status_code == 503, refused.text  # not 200 "c #1"
    assert refused.json()["error"] == "STORE_DATA_LOST"
    ready = embedded.client.get("/ready")
    assert ready.status_code == 503
    assert ready.json()["response_store"] == "data_lost"


def test_an_idempotent_retry_after_a_wipe_is_refused_not_accepted_forever(
    embedded: Server, admin: redis.Redis
) -> None:
    headers = {"Idempotency-Key": "k1", "Prefer": "respond-async"}
    accepted = chat(embedded, "s", "a", **headers)
    assert accepted.status_code == 202
    assert poll(embedded.client, "s", accepted.json()["request_id"]).status_code == 200
    admin.flushall()
    retry = chat(embedded, "s", "a", **headers)
    assert retry.status_code == 503, retry.text  # was 202, never answered (a broker duplicate)
    assert retry.json()["error"] == "STORE_DATA_LOST"
    read = embedded.client.get("/api/v1/chat/s", params={"request_id": retry.json()["request_id"]})
    assert (read.status_code, read.json()["error"]) == (503, "STORE_DATA_LOST")


def test_a_restart_without_persistence_is_loud(
    embedded: Server, private: EphemeralRedis, caplog: pytest.LogCaptureFixture
) -> None:
    assert chat(embedded, "s", "a").json()["result"] == "a #1"
    private.stop()
    private.start()
    refused = until(
        lambda: chat(embedded, "s", "b"),
        lambda r: r.json().get("error") not in ("STORE_UNAVAILABLE", "QUEUE_UNAVAILABLE"),
    )
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "STORE_DATA_LOST"
    assert any("epoch" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    ready = embedded.client.get("/ready").json()
    assert ready["session_store"] == "data_lost"
    assert any("persistence is off" in w for w in ready["warnings"])


def test_a_full_store_fails_ready_and_refuses_turns_at_once(
    embedded: Server, admin: redis.Redis
) -> None:
    assert embedded.client.get("/ready").status_code == 200
    for i in range(100):
        admin.set(f"filler:{i}", "x" * 10_000)
    admin.config_set("maxmemory", str(admin.info("memory")["used_memory"] // 2))
    ready = embedded.client.get("/ready")
    assert ready.status_code == 503  # was 200 while no turn could be answered
    assert ready.json()["response_store"] == "full"
    started = time.monotonic()
    refused = chat(embedded, "s", "a")
    assert (refused.status_code, refused.json()["error"]) == (503, "STORE_FULL")
    assert time.monotonic() - started < 2
    admin.config_set("maxmemory", "0")
    assert until(lambda: chat(embedded, "s", "b"), lambda r: r.status_code == 200)
