"""Losing a Redis store's data is loud: each fault on a private redis-server of its own.

Redis emptied (FLUSHALL, or a restart without persistence), evicting keys, or full with
``noeviction``: the stores must say so (``StoreDataLostError``, ``StoreFullError``, a refused
start) instead of handing out an empty session or a missing ticket as if they were new.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

redis = pytest.importorskip("redis")

from agentkernel import Agent, AgentRegistry, Turn  # noqa: E402
from agentkernel.core import redis_guard  # noqa: E402
from agentkernel.core.config.execution import RunnerConfig  # noqa: E402
from agentkernel.core.errors import (  # noqa: E402
    AKConfigError,
    StoreDataLostError,
    StoreFullError,
    StoreUnavailableError,
)
from agentkernel.pipeline.response_store.redis import RedisResponseStore  # noqa: E402
from agentkernel.pipeline.runner.agent_runner import AgentRunner  # noqa: E402
from agentkernel.pipeline.session_store.base import SessionRecord, TurnOutcome  # noqa: E402
from agentkernel.pipeline.session_store.redis import RedisSessionStore  # noqa: E402
from agentkernel.pipeline.transport.in_memory import InMemoryTransport  # noqa: E402
from agentkernel.pipeline.wire.envelope import (  # noqa: E402
    ATTR_REQUEST_ID,
    ATTR_USER_ID,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket  # noqa: E402
from agentkernel.pipeline.wire.scoping import session_key  # noqa: E402
from tests.chaos.infra import EphemeralRedis, PrivateRedis  # noqa: E402
from tests.runner_config import config_with  # noqa: E402

pytestmark = pytest.mark.redis


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EphemeralRedis]:
    private = EphemeralRedis(tmp_path / "redis")
    yield private
    private.stop()


@pytest.fixture
def admin(server: EphemeralRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url, socket_timeout=5)
    yield client
    client.close()


def sessions(server: PrivateRedis, **kwargs: bool) -> RedisSessionStore:
    return RedisSessionStore(server.url, prefix="loss:", **kwargs)


def commit(store: RedisSessionStore, session: str, request_id: str) -> None:
    base = store.read(session)
    store.commit(session, base, TurnOutcome(request_id, 200, "{}"), {"seen": [request_id]})


def until_reachable(read: object, *args: object) -> object:
    """Call ``read(*args)`` until Redis answers (it was just restarted)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return read(*args)  # type: ignore[operator]
        except StoreUnavailableError:
            assert time.monotonic() < deadline, "Redis did not come back"
            time.sleep(0.1)


# -- emptied -----------------------------------------------------------------------------------


def test_a_session_lost_to_flushall_is_refused_not_started_again(
    server: EphemeralRedis, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    store = sessions(server)
    commit(store, "s", "r1")
    admin.flushall()
    with caplog.at_level(logging.ERROR), pytest.raises(StoreDataLostError, match="session s"):
        store.read("s")
    assert any("epoch" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    with pytest.raises(StoreDataLostError):  # a new session cannot be told from a lost one
        store.read("never-seen")


def test_a_new_session_on_an_intact_store_is_new(server: EphemeralRedis) -> None:
    store = sessions(server)
    commit(store, "s", "r1")
    assert store.read("fresh").version == 0
    assert store.read("s").version == 1


def test_a_restart_without_persistence_is_noticed(server: EphemeralRedis) -> None:
    store = sessions(server)
    commit(store, "s", "r1")
    server.stop()
    server.start()
    with pytest.raises(StoreDataLostError):
        until_reachable(store.read, "s")


def test_a_process_started_after_the_loss_accepts_it(
    server: EphemeralRedis, admin: redis.Redis
) -> None:
    before = sessions(server)
    commit(before, "s", "r1")
    admin.flushall()
    after = sessions(server)  # a restarted process: it adopts the store as it finds it
    assert after.read("s").version == 0
    commit(after, "s", "r2")
    assert before.read("s").version == 1  # records written since are read by everyone
    with pytest.raises(StoreDataLostError):  # but a miss is still refused by the old process
        before.read("other")


def test_restoring_the_data_brings_the_epoch_back(
    server: EphemeralRedis, admin: redis.Redis
) -> None:
    store = sessions(server)
    commit(store, "s", "r1")
    saved = {key: admin.dump(key) for key in admin.keys("loss:*")}
    admin.flushall()
    with pytest.raises(StoreDataLostError):
        store.read("s")
    for key, value in saved.items():
        admin.restore(key, 0, value)
    assert store.read("s").version == 1
    assert store.read("fresh").version == 0


# -- evicting ---------------------------------------------------------------------------------


def test_an_evicting_server_is_refused_at_start_up(
    server: EphemeralRedis, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    admin.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(AKConfigError, match=r"session\.redis\.allow_eviction"):
        sessions(server)
    with pytest.raises(AKConfigError, match=r"response_store\.redis\.allow_eviction"):
        RedisResponseStore(server.url, prefix="loss:")
    with caplog.at_level(logging.WARNING):
        allowed = sessions(server, allow_eviction=True)
    assert any("allkeys-lru" in w for w in allowed.warnings())
    assert any("allkeys-lru" in r.getMessage() for r in caplog.records)


def test_keys_evicted_while_running_make_misses_refused(
    server: EphemeralRedis, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_guard, "CHECK_SECONDS", 0.0)
    store = sessions(server)
    commit(store, "kept", "r1")
    admin.config_set("maxmemory-policy", "allkeys-lru")  # changed behind the running process
    admin.config_set("maxmemory", str(admin.info("memory")["used_memory"] + 1_000_000))
    for i in range(400):
        admin.set(f"filler:{i}", "x" * 10_000)
    assert admin.info("stats")["evicted_keys"] > 0
    admin.config_set("maxmemory", "0")
    store.write("late", SessionRecord(version=1), expected_version=0)
    assert store.read("late").version == 1  # a record that is there is served
    with pytest.raises(StoreDataLostError, match="evict"):
        store.read("missing")
    with pytest.raises(StoreDataLostError):
        store.ping()


# -- persistence ------------------------------------------------------------------------------


def test_persistence_off_is_a_warning(
    server: EphemeralRedis, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        store = sessions(server)
    assert any("persistence is off" in w for w in store.warnings())
    assert any("persistence is off" in r.getMessage() for r in caplog.records)
    durable = PrivateRedis(tmp_path / "durable")
    try:
        assert sessions(durable).warnings() == []
    finally:
        durable.stop()


# -- full (noeviction) ------------------------------------------------------------------------


def fill(admin: redis.Redis) -> None:
    """Make the server full: more data than its (new) maxmemory, and nothing it may evict."""
    for i in range(100):
        admin.set(f"filler:{i}", "x" * 10_000)
    admin.config_set("maxmemory", str(admin.info("memory")["used_memory"] // 2))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        admin.set("one-more", "x")


def test_a_full_server_is_an_outage_not_a_failed_turn(
    server: EphemeralRedis, admin: redis.Redis
) -> None:
    store = sessions(server)
    replies = RedisResponseStore(server.url, prefix="loss:")
    commit(store, "s", "r1")
    fill(admin)
    with pytest.raises(StoreFullError) as refused:
        commit(store, "s", "r2")
    assert isinstance(refused.value, StoreUnavailableError)  # kept and retried, not redelivered
    with pytest.raises(StoreFullError):
        store.ping()
    with pytest.raises(StoreFullError):
        replies.put(ResponseRecord("r2", "s", 200, {}))
    with pytest.raises(StoreFullError):
        replies.ping()
    assert store.read("s").version == 1  # reads still work


# -- the response store ------------------------------------------------------------------------


def test_a_lost_ticket_is_refused_and_replies_can_still_be_written(
    server: EphemeralRedis, admin: redis.Redis
) -> None:
    store = RedisResponseStore(server.url, prefix="loss:")
    assert store.accept(TurnTicket("r1", "s", "f")) is None
    admin.flushall()
    with pytest.raises(StoreDataLostError):
        store.accept(TurnTicket("r1", "s", "f"))
    with pytest.raises(StoreDataLostError):
        store.ticket("r1")
    with pytest.raises(StoreDataLostError):
        store.ping()
    store.put(ResponseRecord("r0", "s", 503, {}))  # a runner's error reply must still land
    assert store.get("r0") is not None


# -- the Agent Runner ---------------------------------------------------------------------------


async def remember(turn: Turn) -> str:
    turn.state.setdefault("seen", []).append(turn.prompt)
    return json.dumps(turn.state["seen"])


def delivery(session: str, prompt: str, user: str | None = None) -> QueueMessage:
    attributes = {ATTR_REQUEST_ID: uuid.uuid4().hex} | ({ATTR_USER_ID: user} if user else {})
    body = json.dumps({"session_id": session, "prompt": prompt})
    group = session_key(session, user)  # the INPUT group of an owned session is its scoped key
    return QueueMessage(body=body, attributes=attributes, group_id=group, receive_count=1)


def answers(transport: InMemoryTransport) -> list[tuple[str, dict[str, object]]]:
    consumer = transport.create_consumer(QueueName.OUTPUT)
    found = []
    while batch := consumer.fetch(10, 0.05):
        for message in batch:
            consumer.ack(message)
            found.append((message.attributes["status_code"], json.loads(message.body)))
    return found


def test_the_runner_answers_a_lost_session_with_an_error_and_keeps_its_owner(
    server: EphemeralRedis, admin: redis.Redis
) -> None:
    registry = AgentRegistry()
    registry.register(Agent("remember", remember))
    transport = InMemoryTransport()
    store = sessions(server)
    runner = AgentRunner(config_with(RunnerConfig()), registry, transport=transport, sessions=store)
    asyncio.run(runner.process_message(delivery("s", "one", user="alice")))
    assert [status for status, _ in answers(transport)] == ["200"]
    admin.flushall()
    asyncio.run(runner.process_message(delivery("s", "two", user="mallory")))
    ((status, doc),) = answers(transport)
    assert (status, doc["error"]) == ("503", "STORE_DATA_LOST")
    for key in (session_key("s", "mallory"), session_key("s", "alice")):
        assert admin.exists(f"loss:sess:{key}") == 0  # nothing committed over the loss
