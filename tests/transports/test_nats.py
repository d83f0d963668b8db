"""The NATS JetStream transport against a real nats-server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from agentkernel.core.config import NatsQueueConfig
from agentkernel.core.errors import AKConfigError, MessageRejectedError
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.nats import NatsTransport, partition_of

pytestmark = pytest.mark.nats


def settings(url: str, **overrides: object) -> NatsQueueConfig:
    tag = uuid.uuid4().hex[:10].upper()
    base: dict[str, object] = {
        "url": url,
        "input_stream": f"IN_{tag}",
        "input_subject_prefix": f"t{tag}.in",
        "output_stream": f"OUT_{tag}",
        "output_subject_prefix": f"t{tag}.out",
        "partitions": 4,
        "ack_wait": 2.0,
        "duplicate_window": 2.0,
        "max_age": 600,
        "retry_backoff": 0,
        "auto_provision": True,
    }
    return NatsQueueConfig.model_validate(base | overrides)


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    NatsTransport.reset()


class TestNatsTransportContract(QueueTransportContract):
    ack_wait = 2.0
    dedup_window = 2.0
    fetch_wait = 8.0
    # JetStream acknowledges by stream sequence, so an ack sent with the handle of an earlier
    # delivery still acknowledges the redelivered copy; there is no delivery-scoped receipt.
    stale_handle_inert = False

    @pytest.fixture(autouse=True)
    def _server(self, nats_url: str) -> None:
        self.url = nats_url

    def make_transport(self) -> QueueTransport:
        return NatsTransport(settings(self.url), {QueueName.INPUT: 10, QueueName.OUTPUT: 10})

    def distinct_groups(self, n: int) -> list[str]:
        # One message per partition is in flight, so parallel sessions need distinct partitions.
        return distinct_partition_groups(n, partitions=4)


def distinct_partition_groups(n: int, partitions: int) -> list[str]:
    seen: dict[int, str] = {}
    i = 0
    while len(seen) < n:
        seen.setdefault(partition_of(f"s{i}", partitions), f"s{i}")
        i += 1
    return list(seen.values())


def test_partitions_are_stable_and_spread() -> None:
    assert partition_of("session-1", 32) == partition_of("session-1", 32)
    assert len({partition_of(f"s{i}", 8) for i in range(200)}) == 8


def test_missing_stream_fails_fast_naming_it(nats_url: str) -> None:
    config = settings(nats_url, auto_provision=False)
    with pytest.raises(AKConfigError, match=config.input_stream):
        NatsTransport(config)


def test_missing_consumer_fails_fast_naming_it(nats_url: str) -> None:
    config = settings(nats_url)
    NatsTransport(config)  # provisions streams and consumers
    more = config.model_copy(update={"partitions": 5, "auto_provision": False})
    with pytest.raises(AKConfigError, match=f"{config.input_stream}-p4"):
        NatsTransport(more)


def test_oversized_message_is_refused(nats_url: str) -> None:
    transport = NatsTransport(settings(nats_url))
    with pytest.raises(MessageRejectedError):
        transport.send(QueueName.INPUT, QueueMessage(body="x" * (2 * 1024 * 1024)))


def test_capacity_warning(nats_url: str, caplog: pytest.LogCaptureFixture) -> None:
    transport = NatsTransport(settings(nats_url))
    transport.check_consumer_capacity(QueueName.INPUT, 9)
    assert "only 4 NATS partitions" in caplog.text


def test_dead_letter_stops_redelivery(nats_url: str) -> None:
    transport = NatsTransport(settings(nats_url, ack_wait=1.0))
    transport.send(QueueName.INPUT, QueueMessage(body="poison", group_id="g"))
    consumer = transport.create_consumer(QueueName.INPUT)
    consumer.dead_letter(consumer.fetch(1, 5)[0])
    assert consumer.fetch(1, 2.0) == []
    consumer.close()
