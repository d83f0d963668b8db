"""The Redis Streams transport when things go wrong: a consumer killed, Redis gone, foreign
entries in its streams."""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agentkernel.core.errors import AKConfigError, TransportError
from agentkernel.pipeline.transport.redis import RedisStreamsTransport
from agentkernel.pipeline.transport.redis import transport as redis_transport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests import servers, session_servers
from tests.transports.test_redis_streams import drop_keys, fetch_all, settings

pytestmark = pytest.mark.redis


@pytest.fixture
def transport(redis_url: str) -> Iterator[RedisStreamsTransport]:
    config = settings(redis_url)
    built = RedisStreamsTransport(config)
    yield built
    built.close()
    drop_keys(redis_url, config.prefix)


class Victim:
    """``redis_victim.py`` in a subprocess, read line by line with a timeout."""

    def __init__(self, transport: RedisStreamsTransport, count: int) -> None:
        script = str(Path(__file__).with_name("redis_victim.py"))
        self.proc = subprocess.Popen(
            [sys.executable, script, transport.settings.model_dump_json(), str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def until_holding(self, timeout: float = 30) -> list[Any]:
        seen: list[Any] = []
        deadline = time.monotonic() + timeout
        while not seen or seen[-1] != "holding":
            seen.append(self.lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        return seen[:-1]

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no close, no hand-back
        self.proc.communicate(timeout=10)


def test_a_killed_consumers_sessions_come_back_after_the_lease(
    transport: RedisStreamsTransport,
) -> None:
    for i in range(3):
        for turn in ("a", "b"):
            transport.send(QueueName.INPUT, QueueMessage(body=f"{turn}{i}", group_id=f"s{i}"))
    victim = Victim(transport, 3)
    assert sorted(victim.until_holding()) == [[f"a{i}", 1] for i in range(3)]
    victim.kill()
    killed = time.monotonic()
    survivor = transport.create_consumer(QueueName.INPUT)
    assert survivor.fetch(10, 1.0) == []  # the sessions are held for the lease
    got = fetch_all(survivor, 3, timeout=10)
    assert sorted((m.body, m.receive_count) for m in got) == [(f"a{i}", 2) for i in range(3)]
    waited = time.monotonic() - killed
    assert transport.settings.ack_wait - 0.2 < waited < transport.settings.ack_wait + 2.5
    for message in got:
        survivor.ack(message)
    rest = fetch_all(survivor, 3)
    assert sorted((m.body, m.receive_count) for m in rest) == [(f"b{i}", 1) for i in range(3)]
    survivor.close()


def test_foreign_tokens_are_dropped_without_stopping_the_fetch(
    transport: RedisStreamsTransport, caplog: pytest.LogCaptureFixture
) -> None:
    keys = transport.queues[QueueName.INPUT]
    client = transport.client
    client.set(keys.session(b"wrong-type"), "a string, not a stream")
    client.xadd(keys.ready, {"x": "no session field"})
    client.xadd(keys.ready, {"s": "nobody"})  # a session without messages
    client.xadd(keys.ready, {"s": "wrong-type"})
    transport.send(QueueName.INPUT, QueueMessage(body="real", group_id="s"))
    consumer = transport.create_consumer(QueueName.INPUT)
    with caplog.at_level(logging.WARNING, "agentkernel.pipeline.transport.redis"):
        got = fetch_all(consumer, 1)
    assert [m.body for m in got] == ["real"]
    assert caplog.text.count("dropped token") == 3
    consumer.ack(got[0])
    assert consumer.fetch(10, 0.3) == []
    assert client.xlen(keys.ready) == 0  # nothing left to trip over
    consumer.close()


class PrivateRedis:
    """A redis-server of the test's own, without persistence, so it can be stopped."""

    def __init__(self, durable_dir: Path | None = None) -> None:
        try:
            binary = session_servers.redis_binary()  # the session's kind: Redis, else Valkey
        except RuntimeError as exc:
            servers.unavailable(str(exc))
        self.binary, self.port = str(binary), servers.free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        # with a directory: an append-only file synced on every write, kept across a kill
        self.persistence = ["no"]
        if durable_dir is not None:
            self.persistence = ["yes", "--appendfsync", "always", "--dir", str(durable_dir)]

    def start(self) -> None:
        args = ["--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly"]
        command = [self.binary, *args, *self.persistence]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not servers.port_open(self.port):
            assert time.monotonic() < deadline and self.proc.poll() is None, "redis died"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    yield server
    server.stop()


def test_redis_gone_and_back_is_a_transport_error_at_once(private_redis: PrivateRedis) -> None:
    transport = RedisStreamsTransport(settings(private_redis.url))
    consumer = transport.create_consumer(QueueName.INPUT)
    transport.send(QueueName.INPUT, QueueMessage(body="before", group_id="s"))
    private_redis.stop()
    for call in (
        lambda: transport.send(QueueName.INPUT, QueueMessage(body="x", group_id="s")),
        lambda: consumer.fetch(1, 5.0),
        transport.ping,
    ):
        started = time.monotonic()
        with pytest.raises(TransportError, match="Redis"):
            call()
        assert time.monotonic() - started < 1.0
    private_redis.start()  # without persistence: the queue and its group are gone
    with pytest.raises(TransportError, match="consumer group is gone"):
        consumer.fetch(1, 0.2)
    again = RedisStreamsTransport(transport.settings)  # a restarted process provisions again
    again.send(QueueName.INPUT, QueueMessage(body="after", group_id="s"))
    got = fetch_all(again.create_consumer(QueueName.INPUT), 1)
    assert [(m.body, m.receive_count) for m in got] == [("after", 1)]
    again.close()
    transport.close()


def test_an_unreachable_redis_fails_start_up_fast() -> None:
    started = time.monotonic()
    with pytest.raises(TransportError):
        RedisStreamsTransport(settings(f"redis://127.0.0.1:{servers.free_port()}/0"))
    assert time.monotonic() - started < 1.0


def test_an_evicting_server_is_refused_unless_allowed(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(private_redis.url)
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.close()
    with pytest.raises(AKConfigError, match="allkeys-lru"):
        RedisStreamsTransport(settings(private_redis.url))
    RedisStreamsTransport(settings(private_redis.url, allow_eviction=True)).close()
    assert "may evict queued messages" in caplog.text


def test_departed_members_holding_nothing_are_removed(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_transport, "PRUNE_IDLE_SECONDS", 0.5)
    config = settings(redis_url, ack_wait=0.05)
    transport = RedisStreamsTransport(config)
    try:
        transport.send(QueueName.INPUT, QueueMessage(body="held", group_id="s"))
        holder = transport.create_consumer(QueueName.INPUT)
        assert [m.body for m in fetch_all(holder, 1)] == ["held"]
        idle = transport.create_consumer(QueueName.INPUT)  # a crashed process: never closed
        time.sleep(0.7)
        newcomer = transport.create_consumer(QueueName.INPUT)
        names = transport.consumer_names(QueueName.INPUT)
        assert idle.name not in names
        assert {holder.name, newcomer.name} <= set(names)  # the holder keeps its delivery
        # a live member removed by mistake joins again with its next read (here it claims the
        # holder's message, whose 0.05 s lease ran out long ago)
        assert [(m.body, m.receive_count) for m in idle.fetch(1, 1.0)] == [("held", 2)]
        assert idle.name in transport.consumer_names(QueueName.INPUT)
    finally:
        transport.close()
        drop_keys(redis_url, config.prefix)


def test_an_expired_lease_behind_many_live_ones_is_found_by_one_fetch(
    transport: RedisStreamsTransport,
) -> None:
    for i in range(60):
        transport.send(QueueName.INPUT, QueueMessage(body=f"busy{i}", group_id=f"b{i}"))
    busy = transport.create_consumer(QueueName.INPUT)
    running = fetch_all(busy, 60)
    transport.send(QueueName.INPUT, QueueMessage(body="late", group_id="late"))
    crashed = transport.create_consumer(QueueName.INPUT)
    assert [m.body for m in fetch_all(crashed, 1)] == ["late"]
    deadline = time.monotonic() + transport.settings.ack_wait + 0.3
    while time.monotonic() < deadline:  # the busy consumer keeps its 60 leases alive
        for message in running:
            busy.extend_lease(message)
        time.sleep(0.2)
    got = transport.create_consumer(QueueName.INPUT).fetch(1, 0.2)
    assert [(m.body, m.receive_count) for m in got] == [("late", 2)]


def test_a_token_naming_no_session_is_not_taken_for_the_empty_one(
    transport: RedisStreamsTransport,
) -> None:
    for body in ("first", "second"):
        transport.send(QueueName.INPUT, QueueMessage(body=body, group_id=""))
    holder = transport.create_consumer(QueueName.INPUT)
    assert [m.body for m in fetch_all(holder, 1)] == ["first"]
    waiting = transport.create_consumer(QueueName.INPUT)
    foreign = threading.Timer(
        0.3, transport.client.xadd, (transport.queues[QueueName.INPUT].ready, {"x": "1"})
    )
    foreign.start()  # arrives while the waiting consumer blocks on the ready stream
    try:
        got = waiting.fetch(1, 1.5)
    finally:
        foreign.join(5)
    assert got == []  # "second" waits for "first", whatever the foreign token says


# -- acks sent without waiting -------------------------------------------------------------------


def test_acks_take_effect_before_the_acking_consumer_fetches_again(
    transport: RedisStreamsTransport,
) -> None:
    for i in range(20):
        for turn in ("a", "b"):
            transport.send(QueueName.INPUT, QueueMessage(body=f"{turn}{i}", group_id=f"s{i}"))
    acking = transport.create_consumer(QueueName.INPUT)
    for message in fetch_all(acking, 20):
        acking.ack(message)
    other = transport.create_consumer(QueueName.INPUT)
    got = fetch_all(other, 20)
    assert sorted((m.body, m.receive_count) for m in got) == sorted((f"b{i}", 1) for i in range(20))


def test_an_ack_whose_script_is_gone_is_sent_again(private_redis: PrivateRedis) -> None:
    transport = RedisStreamsTransport(settings(private_redis.url))
    for body in ("one", "two"):
        transport.send(QueueName.INPUT, QueueMessage(body=body, group_id="s"))
    consumer = transport.create_consumer(QueueName.INPUT)
    (one,) = fetch_all(consumer, 1)
    transport.client.script_flush()  # as after a restart of a Redis that kept its data
    consumer.ack(one)
    assert [(m.body, m.receive_count) for m in fetch_all(consumer, 1)] == [("two", 1)]
    transport.close()


def test_acks_on_a_connection_the_server_closed_are_sent_again(
    private_redis: PrivateRedis,
) -> None:
    transport = RedisStreamsTransport(settings(private_redis.url, ack_wait=30.0))
    for body in ("one", "two", "three"):
        transport.send(QueueName.INPUT, QueueMessage(body=body, group_id="s"))
    consumer = transport.create_consumer(QueueName.INPUT)
    (one,) = fetch_all(consumer, 1)
    consumer.ack(one)  # the acks' connection is open from here on
    (two,) = fetch_all(consumer, 1)
    admin = redis.Redis.from_url(private_redis.url)
    admin.client_kill_filter(_type="normal", skipme=True)  # what a restart does to clients
    admin.close()
    consumer.ack(two)  # goes out on the closed connection: its answer never comes
    got = fetch_all(consumer, 1, timeout=5)  # not after the 30 s lease
    assert [(m.body, m.receive_count) for m in got] == [("three", 1)]
    transport.close()


def test_a_nack_redis_was_away_for_is_sent_again_by_the_next_fetch(tmp_path: Path) -> None:
    server = PrivateRedis(durable_dir=tmp_path)
    server.start()
    try:
        transport = RedisStreamsTransport(settings(server.url, ack_wait=30.0))
        transport.send(QueueName.INPUT, QueueMessage(body="turn", group_id="s"))
        consumer = transport.create_consumer(QueueName.INPUT)
        (turn,) = fetch_all(consumer, 1)
        server.stop()  # the turn failed and Redis is away: the nack cannot be sent
        with pytest.raises(TransportError):
            consumer.nack(turn)
        server.start()  # with its data
        got = fetch_all(consumer, 1, timeout=5)  # not after the 30 s lease
        assert [(m.body, m.receive_count) for m in got] == [("turn", 2)]
        transport.close()
    finally:
        server.stop()
