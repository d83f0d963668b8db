"""A NATS consumer that stops fetching keeps what its open requests already brought."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.transport.nats import NatsTransport
from tests.transports.test_nats import settings

pytestmark = pytest.mark.nats


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    NatsTransport.reset()


def test_what_arrived_after_the_last_fetch_is_handed_to_the_drain_not_given_back(
    nats_url: str,
) -> None:
    """A busy partition's request stays open past its fetch; what it brings once the partition
    frees was delivered here. A drain that gave it back (nak) cost it a delivery: a rolling
    deploy moved its turn to attempt 2, and a few of them toward the dead-letter queue."""
    transport = NatsTransport(settings(nats_url, partitions=1, ack_wait=30.0))
    for body in ("first", "second"):
        transport.send(QueueName.INPUT, QueueMessage(body=body, group_id="g"))
    holder, leaving, other = (transport.create_consumer(QueueName.INPUT) for _ in range(3))
    [first] = holder.fetch(1, 3.0)
    assert leaving.fetch(1, 0.2) == []  # the partition is busy: its request stays open
    holder.ack(first)
    deadline = time.monotonic() + 5
    while leaving.held == 0:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the open request did not bring the next message"
        time.sleep(0.01)
    late = leaving.stop_fetching()
    assert [(m.body, m.receive_count) for m in late] == [("second", 1)]
    leaving.ack(late[0])
    leaving.close()
    assert other.fetch(1, 1.0) == []  # nothing was given back to run a second time
    for consumer in (holder, other):
        consumer.close()


def test_a_consumer_with_nothing_in_hand_returns_nothing_when_it_stops(nats_url: str) -> None:
    transport = NatsTransport(settings(nats_url, partitions=2, ack_wait=30.0))
    consumer = transport.create_consumer(QueueName.INPUT)
    assert consumer.fetch(1, 0.1) == []
    assert consumer.stop_fetching() == []
    consumer.close()
