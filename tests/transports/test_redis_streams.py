"""The Redis Streams transport against a real Redis (the session's: tests/session_servers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from agentkernel.core.config.queues import RedisQueueConfig
from agentkernel.core.errors import AKConfigError, MessageRejectedError
from agentkernel.core.redis_client import redis_client
from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.transport.redis import RedisStreamsTransport
from agentkernel.pipeline.transport.redis.consumer import PARKING_CONSUMER
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.foreign import REDIS_KINDS, publish_redis

pytestmark = pytest.mark.redis


def settings(url: str, **overrides: object) -> RedisQueueConfig:
    base: dict[str, object] = {
        "url": url,
        "prefix": f"t:{uuid.uuid4().hex[:10]}:",
        "ack_wait": 2.0,
        "dedup_window": 2.0,
        "auto_provision": True,
    }
    return RedisQueueConfig.model_validate(base | overrides)


def drop_keys(url: str, prefix: str) -> None:
    client = redis_client(url)  # on a cluster: every primary's keys
    for pattern in (f"{{{prefix}*", f"{prefix}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.close()


@pytest.fixture
def prefixes(redis_url: str) -> Iterator[list[str]]:
    """Prefixes the test used; their keys are deleted afterwards."""
    used: list[str] = []
    yield used
    for prefix in used:
        drop_keys(redis_url, prefix)


class TestRedisStreamsContract(QueueTransportContract):
    ack_wait = 2.0
    dedup_window = 2.0
    nack_delay = 2.0
    undecodable_kinds = REDIS_KINDS

    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str, prefixes: list[str]) -> None:
        self.url, self.prefixes = redis_url, prefixes

    def make_transport(self) -> QueueTransport:
        config = settings(self.url, ack_wait=self.ack_wait, dedup_window=self.dedup_window)
        self.prefixes.append(config.prefix)
        return RedisStreamsTransport(config)

    def open_consumers(self, transport: QueueTransport, queue: QueueName) -> int | None:
        assert isinstance(transport, RedisStreamsTransport)
        return len([n for n in transport.consumer_names(queue) if n != PARKING_CONSUMER])

    def send_undecodable(
        self, transport: QueueTransport, queue: QueueName, kind: str, group: str, request_id: str
    ) -> str | None:
        assert isinstance(transport, RedisStreamsTransport)
        return publish_redis(transport, queue, kind, group, request_id)


@pytest.fixture
def make(redis_url: str, prefixes: list[str]) -> Iterator[Callable[..., RedisStreamsTransport]]:
    """Build transports on fresh prefixes; closed and their keys deleted afterwards."""
    built: list[RedisStreamsTransport] = []

    def build(**overrides: object) -> RedisStreamsTransport:
        config = settings(redis_url, **overrides)
        prefixes.append(config.prefix)
        built.append(RedisStreamsTransport(config))
        return built[-1]

    yield build
    for transport in built:
        transport.close()


def fetch_all(consumer: TransportConsumer, n: int, timeout: float = 10.0) -> list[QueueMessage]:
    got: list[QueueMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += consumer.fetch(n - len(got), 1.0)
    return got


# -- one turn in flight per session, not per partition ------------------------------------------


def test_turns_in_flight_grow_with_consumers(make: Callable[..., RedisStreamsTransport]) -> None:
    transport = make()
    for i in range(40):
        for turn in range(2):
            transport.send(QueueName.INPUT, QueueMessage(body=f"{i}-{turn}", group_id=f"s{i}"))
    consumers = [transport.create_consumer(QueueName.INPUT) for _ in range(4)]
    held = [m for c in consumers for m in fetch_all(c, 10)]
    assert sorted(m.body for m in held) == sorted(f"{i}-0" for i in range(40))
    assert all(c.fetch(10, 0.2) == [] for c in consumers)  # each session's second turn waits
    for c in consumers:
        c.close()


def test_close_hands_back_at_once_counting_a_delivery(
    make: Callable[..., RedisStreamsTransport],
) -> None:
    transport = make(ack_wait=60.0)
    transport.send(QueueName.INPUT, QueueMessage(body="held", group_id="s"))
    leaving = transport.create_consumer(QueueName.INPUT)
    assert [m.body for m in fetch_all(leaving, 1)] == ["held"]
    leaving.close()
    started = time.monotonic()
    got = fetch_all(transport.create_consumer(QueueName.INPUT), 1)
    assert [(m.body, m.receive_count) for m in got] == [("held", 2)]
    assert time.monotonic() - started < 5  # not after the 60 s lease


def test_nack_later_beyond_the_lease_is_left_to_the_caller(
    make: Callable[..., RedisStreamsTransport],
) -> None:
    transport = make(ack_wait=2.0)
    transport.send(QueueName.INPUT, QueueMessage(body="m", group_id="s"))
    consumer = transport.create_consumer(QueueName.INPUT)
    (message,) = fetch_all(consumer, 1)
    assert consumer.nack_later(message, 5.0) is False
    consumer.nack(message)
    assert [m.receive_count for m in fetch_all(consumer, 1)] == [2]


# -- dedup and dead letters --------------------------------------------------------------------


def test_dedup_holds_across_processes_and_is_per_queue(
    make: Callable[..., RedisStreamsTransport],
) -> None:
    first = make(dedup_window=30.0)
    second = RedisStreamsTransport(first.settings)  # another process on the same queues
    assert first.send(QueueName.INPUT, QueueMessage(body="a", dedup_id="d")) is not None
    assert second.send(QueueName.INPUT, QueueMessage(body="b", dedup_id="d")) is None
    assert second.send(QueueName.OUTPUT, QueueMessage(body="c", dedup_id="d")) is not None
    second.close()


def test_dead_letter_keeps_the_entry_and_frees_the_session(
    make: Callable[..., RedisStreamsTransport],
) -> None:
    transport = make()
    attributes = {"request_id": "r1", "odd": " ✓ "}
    for body in ("poison", "next"):
        transport.send(
            QueueName.INPUT, QueueMessage(body=body, group_id="s", attributes=attributes)
        )
    consumer = transport.create_consumer(QueueName.INPUT)
    (poison,) = fetch_all(consumer, 1)
    consumer.nack(poison)
    (poison,) = fetch_all(consumer, 1)
    consumer.dead_letter(poison)
    assert [m.body for m in fetch_all(consumer, 1)] == ["next"]
    (entry,) = transport.client.xrange(transport.queues[QueueName.INPUT].dlq)
    fields = entry[1]
    assert (fields[b"b"], fields[b"session"], fields[b"receive_count"]) == (b"poison", b"s", b"2")
    assert json.loads(fields[b"a"]) == attributes
    assert fields[b"reason"] == b"exceeded max_receive_count"


# -- positions -----------------------------------------------------------------------------------


def test_a_queue_created_again_is_a_new_unit(make: Callable[..., RedisStreamsTransport]) -> None:
    transport = make()
    transport.send(QueueName.INPUT, QueueMessage(body="old", group_id="s"))
    consumer = transport.create_consumer(QueueName.INPUT)
    (old,) = fetch_all(consumer, 1)
    consumer.ack(old)
    consumer.close()
    drop_keys(transport.settings.url, transport.settings.prefix)  # e.g. a Redis that lost it all
    again = RedisStreamsTransport(transport.settings)
    again.send(QueueName.INPUT, QueueMessage(body="new", group_id="s"))
    (new,) = fetch_all(again.create_consumer(QueueName.INPUT), 1)
    assert old.position is not None and new.position is not None
    assert new.position.unit != old.position.unit
    assert not new.position.covers(old.position) and not old.position.covers(new.position)
    again.close()


# -- configuration and hostile input -----------------------------------------------------------


def test_a_missing_group_fails_start_up_naming_the_command(redis_url: str) -> None:
    config = settings(redis_url, auto_provision=False)
    with pytest.raises(AKConfigError, match=r"XGROUP CREATE '\{" + config.prefix):
        RedisStreamsTransport(config)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"url": "nats://127.0.0.1:6379"}, "execution.queues.redis"),
        ({"socket_timeout": 1.0, "block_slice": 1.0}, "socket_timeout"),
    ],
)
def test_bad_settings_are_config_errors(
    redis_url: str, overrides: dict[str, object], match: str
) -> None:
    with pytest.raises(AKConfigError, match=match):
        RedisStreamsTransport(settings(redis_url).model_copy(update=overrides))


def test_the_factory_builds_it_from_the_queues_block(redis_url: str, prefixes: list[str]) -> None:
    block = settings(redis_url)
    prefixes.append(block.prefix)
    transport = QueueTransportFactory.create({"type": "redis", "redis": block.model_dump()})
    assert isinstance(transport, RedisStreamsTransport)
    transport.close()
    with pytest.raises(AKConfigError, match=r"execution\.queues\.redis: block is required"):
        QueueTransportFactory.create({"type": "redis"})
    with pytest.raises(AKConfigError, match="block_slice"):
        QueueTransportFactory.create({"type": "redis", "redis": {"block_slice": "soon"}})


def test_hostile_messages_are_refused_or_carried_intact(
    make: Callable[..., RedisStreamsTransport],
) -> None:
    transport = make(max_message_bytes=1000)
    with pytest.raises(MessageRejectedError):
        transport.send(QueueName.INPUT, QueueMessage(body="x" * 1001))
    for bad in ({"body": "\udcff"}, {"group_id": "\udcff"}, {"dedup_id": "\ud800"}):
        with pytest.raises(MessageRejectedError):
            transport.send(QueueName.INPUT, QueueMessage.model_validate(bad))
    groups = ["", "{other}", "a:s:b", "*", "\n\x00", "日本", "-"]
    for group in groups:
        dedup = f"{{{group}}}\x00"
        transport.send(QueueName.INPUT, QueueMessage(body=group, group_id=group, dedup_id=dedup))
    transport.send(QueueName.INPUT, QueueMessage(body="none", attributes={"k": "\udcff"}))
    consumer = transport.create_consumer(QueueName.INPUT)
    assert consumer.fetch(0, 0.1) == [] and consumer.fetch(-1, -5.0) == []
    got = fetch_all(consumer, len(groups) + 1)
    assert sorted((m.body, m.group_id) for m in got) == sorted(
        [(g, g) for g in groups] + [("none", None)]
    )
    assert next(m for m in got if m.body == "none").attributes == {"k": "\udcff"}
    assert all(m.undecodable is None for m in got)


def test_client_config_reaches_the_client(
    make: Callable[..., RedisStreamsTransport],
) -> None:
    transport = make(client_config={"protocol": 3, "client_name": "ak-test"})
    assert transport.client.client_getname() in ("ak-test", b"ak-test")
    transport.send(QueueName.INPUT, QueueMessage(body="resp2", group_id="s"))
    assert [m.body for m in fetch_all(transport.create_consumer(QueueName.INPUT), 1)] == ["resp2"]


def test_any_consumer_of_the_queue_settles_a_delivery(
    make: Callable[..., RedisStreamsTransport],
) -> None:
    transport = make()
    for body in ("one", "two"):
        transport.send(QueueName.INPUT, QueueMessage(body=body, group_id="s"))
    fetcher, settler = (transport.create_consumer(QueueName.INPUT) for _ in range(2))
    (one,) = fetch_all(fetcher, 1)
    settler.extend_lease(one)
    settler.ack(one)
    assert [m.body for m in fetch_all(settler, 1)] == ["two"]


def test_a_missing_redis_extra_is_named_with_the_install_command() -> None:
    code = (
        "import sys\n"
        "sys.modules['redis'] = None  # as if redis-py were not installed\n"
        "from agentkernel.pipeline.transport.base import QueueTransportFactory\n"
        "try:\n"
        "    QueueTransportFactory.create({'type': 'redis', 'redis': {}})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "execution.queues.type: redis requires the 'redis' extra: pip install 'agentkernel[redis]'"
    )
