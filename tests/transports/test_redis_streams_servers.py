"""The Redis Streams transport's contract on the other servers it claims: Redis 6.2 (the oldest
supported), Valkey, and a Redis Cluster (``redis+cluster://``, tests/redis_servers.py).

Each class is the contract suite of tests/transports/test_redis_streams.py with the server
changed, so the suites cannot drift apart, and two settings made cheaper (the session's Redis
runs the rest): leases and windows of one second instead of two, and one kind of undecodable
entry instead of four (the kinds differ only in what the Python side decodes; the server's part,
dead-lettering through the script, is the same for each). That keeps the three servers' runs
near 25 s each.
"""

from __future__ import annotations

import time

import pytest

from agentkernel.core.errors import AKConfigError
from agentkernel.core.redis_client import is_cluster
from agentkernel.pipeline.transport.redis import RedisStreamsTransport
from agentkernel.pipeline.transport.redis.transport import require_version
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.redis_servers import PrivateCluster
from tests.transports import test_redis_streams as on_redis7
from tests.transports.test_redis_streams import (
    fetch_all,
    prefixes,  # noqa: F401  (the suite's fixture)
    settings,
)

pytestmark = pytest.mark.redis


class OnAnotherServer(on_redis7.TestRedisStreamsContract):
    """The contract with shorter waits; subclasses name the server."""

    ack_wait = dedup_window = nack_delay = 1.0
    undecodable_kinds = ("body",)


class TestRedis62StreamsContract(OnAnotherServer):
    @pytest.fixture
    def redis_url(self, redis62_url: str) -> str:
        return redis62_url


class TestValkeyStreamsContract(OnAnotherServer):
    @pytest.fixture
    def redis_url(self, valkey_url: str) -> str:
        return valkey_url


class TestRedisClusterStreamsContract(OnAnotherServer):
    @pytest.fixture
    def redis_url(self, redis_cluster_url: str) -> str:
        return redis_cluster_url


def test_a_cluster_url_builds_a_cluster_client_serving_each_queue_from_its_slot(
    redis_cluster_url: str,
) -> None:
    transport = RedisStreamsTransport(settings(redis_cluster_url))
    try:
        assert is_cluster(transport.client)
        client = transport.client
        slots = {client.keyslot(keys.ready) for keys in transport.queues.values()}  # type: ignore[attr-defined]
        assert len(slots) == 2  # INPUT and OUTPUT hash apart
        transport.send(QueueName.INPUT, QueueMessage(body="in", group_id="s"))
        transport.send(QueueName.OUTPUT, QueueMessage(body="out", group_id="s"))
        for queue, body in ((QueueName.INPUT, "in"), (QueueName.OUTPUT, "out")):
            consumer = transport.create_consumer(queue)
            (got,) = fetch_all(consumer, 1)
            consumer.ack(got)
            consumer.close()
            assert got.body == body
    finally:
        transport.close()
        on_redis7.drop_keys(redis_cluster_url, transport.settings.prefix)


@pytest.mark.parametrize("version", ["6.0.16", "5.0.14", "4.0.0"])
def test_a_server_older_than_6_2_is_refused_naming_the_version_needed(version: str) -> None:
    with pytest.raises(AKConfigError, match=rf"Redis {version}; .* needs Redis 6\.2 or later"):
        require_version(version)


@pytest.mark.parametrize("version", ["6.2.0", "6.2.14", "7.2.4", "10.0.1", ""])
def test_6_2_and_later_are_accepted(version: str) -> None:
    require_version(version)  # "" (no version reported): the first fetch says what is missing


def test_acks_and_fetches_follow_a_queue_moved_to_another_node(
    redis_cluster: PrivateCluster,
) -> None:
    """A resharding moves the queue's slot while a message is held: its ack goes out on the
    acks' connection to the old node, is refused there (MOVED) and runs through the cluster
    client; had it been lost, the session's next message could not come before the lease."""
    transport = RedisStreamsTransport(settings(redis_cluster.url, ack_wait=3.0))
    try:
        for body in ("one", "two", "three"):
            transport.send(QueueName.INPUT, QueueMessage(body=body, group_id="s"))
        consumer = transport.create_consumer(QueueName.INPUT)
        (one,) = fetch_all(consumer, 1)
        ready = transport.queues[QueueName.INPUT].ready
        moved_to = redis_cluster.move_slot(transport.client.keyslot(ready))  # type: ignore[attr-defined]
        started = time.monotonic()
        consumer.ack(one)
        (two,) = fetch_all(consumer, 1)
        assert (two.body, two.receive_count) == ("two", 1)
        assert time.monotonic() - started < 2.5  # not after the 3 s lease
        consumer.ack(two)  # on a connection to the slot's new node
        (three,) = fetch_all(consumer, 1)
        assert (three.body, three.receive_count) == ("three", 1)
        consumer.ack(three)
        assert consumer.fetch(1, 3.5) == []  # no ack was lost: nothing comes back
        assert transport.client.get_node_from_key(ready).port == moved_to  # type: ignore[attr-defined]
        consumer.close()
    finally:
        transport.close()
        on_redis7.drop_keys(redis_cluster.url, transport.settings.prefix)
