"""The Redis Streams transport against the real Redis on 127.0.0.1:6379."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from agentkernel.core.config import RedisQueueConfig
from agentkernel.pipeline.envelope import QueueName
from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.redis import RedisStreamsTransport
from agentkernel.pipeline.transport.redis.consumer import PARKING_CONSUMER
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
    client = redis.Redis.from_url(url)
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
