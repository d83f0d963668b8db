"""Two Kafka clusters sharing one Redis for their bookkeeping keep apart: the keys name the
cluster, so one cluster's dedup claims and finished offsets never decide the other's records."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentkernel.pipeline.transport.kafka import KafkaTransport
from agentkernel.pipeline.transport.kafka.identity import bookkeeping_prefix
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests import servers
from tests.transports.test_kafka import kafka_settings

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture
def two_clusters() -> Iterator[tuple[servers.Tansu, servers.Tansu]]:
    try:
        alpha, beta = servers.Tansu("alpha"), servers.Tansu("beta")
    except RuntimeError as exc:
        servers.unavailable(str(exc))
    yield alpha, beta
    alpha.stop()
    beta.stop()


def received(transport: KafkaTransport, count: int, timeout: float = 20) -> list[str]:
    """The bodies of ``count`` records (fewer when the wait ends first), each acknowledged."""
    consumer = transport.create_consumer(QueueName.INPUT)
    bodies: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(bodies) < count and time.monotonic() < deadline:
            for message in consumer.fetch(10, 1.0):
                consumer.ack(message)
                bodies.append(message.body)
        return bodies
    finally:
        consumer.close()


def turn(body: str, dedup_id: str) -> QueueMessage:
    return QueueMessage(body=body, attributes={}, group_id="s", dedup_id=dedup_id)


def test_the_same_group_on_two_clusters_shares_no_bookkeeping(
    two_clusters: tuple[servers.Tansu, servers.Tansu], redis_url: str
) -> None:
    """The observed risk: the same group and topics on two clusters, one Redis. A record on
    the second cluster with a dedup id the first had claimed was dropped as a duplicate."""
    alpha, beta = two_clusters
    shared = kafka_settings(
        alpha.bootstrap, bookkeeping="redis", bookkeeping_redis_url=redis_url, dedup_window=120.0
    )
    transports = [
        KafkaTransport(shared),
        KafkaTransport(shared.model_copy(update={"bootstrap_servers": beta.bootstrap})),
    ]
    on_alpha, on_beta = transports
    try:
        on_alpha.send(QueueName.INPUT, turn("alpha", "turn-1"))
        assert received(on_alpha, 1) == ["alpha"]
        # The same dedup id at another offset of the same partition on the other cluster.
        on_beta.send(QueueName.INPUT, turn("before", "turn-0"))
        on_beta.send(QueueName.INPUT, turn("beta", "turn-1"))
        assert received(on_beta, 2, timeout=10) == ["before", "beta"]
    finally:
        for transport in transports:
            transport.close()


def test_the_bookkeeping_prefix_names_the_cluster_and_the_group() -> None:
    assert bookkeeping_prefix("MkU3OEVBNTcwNTJENDM2Qk", "g1") == "ak:MkU3OEVBNTcwNTJENDM2Qk:g1:"
    # A hash tag or a separator in a reported id cannot split or merge key spaces.
    assert bookkeeping_prefix("a{b}:c", "g1") == "ak:a_b__c:g1:"


def test_a_cluster_without_an_id_is_named_by_its_bootstrap_servers() -> None:
    prefix = bookkeeping_prefix(None, "g1", bootstrap="b:9092,a:9092")
    assert prefix == bookkeeping_prefix(None, "g1", bootstrap="a:9092, b:9092")
    assert prefix != bookkeeping_prefix(None, "g1", bootstrap="c:9092")
