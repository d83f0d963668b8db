"""The in-memory transport passes the contract suite, opting out of nothing it could give."""

from __future__ import annotations

import logging
import math

import pytest

from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.in_memory import InMemoryTransport, ManualClock
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


class TestInMemoryTransportContract(QueueTransportContract):
    ack_wait = 30.0
    dedup_window = 300.0
    # It carries QueueMessage objects within one process: nothing reaches it that was not sent
    # through ``send``, so there is nothing it could fail to decode (undecodable_kinds is empty).

    def make_transport(self) -> QueueTransport:
        self.clock = ManualClock()
        InMemoryTransport.reset()  # fresh queues per case (they are process-wide)
        return InMemoryTransport(ack_wait=self.ack_wait, dedup_window=300.0, clock=self.clock)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def open_consumers(self, transport: QueueTransport, queue: QueueName) -> int:
        assert isinstance(transport, InMemoryTransport)
        return transport.open_consumers(queue)


class TestInMemoryTransportOnARealClock(QueueTransportContract):
    """The suite's default knobs on real time: its own waits must fit a 1 s lease."""

    def make_transport(self) -> QueueTransport:
        InMemoryTransport.reset()
        return InMemoryTransport(ack_wait=self.ack_wait, dedup_window=self.dedup_window)

    def open_consumers(self, transport: QueueTransport, queue: QueueName) -> int:
        assert isinstance(transport, InMemoryTransport)
        return transport.open_consumers(queue)


class UpstreamStyleContract(QueueTransportContract):
    """Written as upstream's suite is subclassed: only ``force_redelivery`` moves time."""

    ack_wait = 3.0

    def make_transport(self) -> QueueTransport:
        self.clock = ManualClock()
        InMemoryTransport.reset()
        return InMemoryTransport(ack_wait=self.ack_wait, clock=self.clock)

    def force_redelivery(self) -> None:
        self.clock.advance(self.ack_wait + 1.0)


def test_the_suite_lets_leases_run_out_through_force_redelivery() -> None:
    case = UpstreamStyleContract()
    case._consumers, case._transports = [], []
    try:
        case.test_unacked_message_is_redelivered_after_lease(case.make_transport())
        case.test_stale_handle_ack_is_harmless(case.make_transport())
        case.test_ack_removes_message_for_good(case.make_transport())
    finally:
        for consumer in case._consumers:
            consumer.close()


def test_instances_share_the_process_wide_queues() -> None:
    InMemoryTransport().send(QueueName.INPUT, QueueMessage(body="a", group_id="g"))
    got = InMemoryTransport().create_consumer(QueueName.INPUT).fetch(1, 0.5)
    assert [m.body for m in got] == ["a"]
    assert InMemoryTransport.shared().depth(QueueName.INPUT) == 0  # the same queues again


def test_reset_gives_every_instance_new_empty_queues() -> None:
    before = InMemoryTransport()
    before.send(QueueName.INPUT, QueueMessage(body="old"))
    InMemoryTransport.reset()
    assert before.depth(QueueName.INPUT) == 0
    InMemoryTransport().send(QueueName.INPUT, QueueMessage(body="new"))
    assert [m.body for m in before.create_consumer(QueueName.INPUT).fetch(5, 0.2)] == ["new"]


def test_the_first_instance_fixes_the_settings_and_a_different_one_is_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    first = InMemoryTransport(ack_wait=5.0, clock=clock)
    first.send(QueueName.INPUT, QueueMessage(body="b", group_id="g"))
    with caplog.at_level(logging.WARNING, "agentkernel.pipeline.transport.in_memory"):
        InMemoryTransport()  # nothing asked for: no warning
        later = InMemoryTransport(ack_wait=60.0)
        consumer = later.create_consumer(QueueName.INPUT)
    assert len(caplog.records) == 1 and "ack_wait 5.0s" in caplog.records[0].getMessage()
    assert consumer.lease_seconds == 5.0
    assert consumer.fetch(1, 0.05)[0].receive_count == 1
    clock.advance(5.0)  # the first instance's clock and lease hold
    assert consumer.fetch(1, 0.05)[0].receive_count == 2


@pytest.mark.parametrize("bad", [-1.0, math.nan, -math.inf])
def test_a_negative_or_nan_duration_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="ack_wait"):
        InMemoryTransport(ack_wait=bad)
    with pytest.raises(ValueError, match="dedup_window"):
        InMemoryTransport(dedup_window=bad)


def test_real_clock_lease_expiry_wakes_a_waiting_fetch() -> None:
    transport = InMemoryTransport(ack_wait=0.2)
    transport.send(QueueName.INPUT, QueueMessage(body="b", group_id="g"))
    consumer = transport.create_consumer(QueueName.INPUT)
    assert consumer.fetch(1, 1.0)[0].receive_count == 1
    again = consumer.fetch(1, 2.0)  # must wake when the lease runs out, not at the wait's end
    assert [m.receive_count for m in again] == [2]


def test_groupless_messages_are_independent() -> None:
    transport = InMemoryTransport()
    for body in ("a", "b"):
        transport.send(QueueName.INPUT, QueueMessage(body=body))
    got = transport.create_consumer(QueueName.INPUT).fetch(10, 0.1)
    assert sorted(m.body for m in got) == ["a", "b"]


def test_shared_transport_is_process_wide_until_reset() -> None:
    InMemoryTransport.reset()
    InMemoryTransport.shared().send(QueueName.OUTPUT, QueueMessage(body="x"))
    assert InMemoryTransport.shared().depth(QueueName.OUTPUT) == 1
    InMemoryTransport.reset()
    assert InMemoryTransport.shared().depth(QueueName.OUTPUT) == 0


def test_message_sent_is_not_mutated_by_the_consumer() -> None:
    transport = InMemoryTransport()
    original = QueueMessage(body="b", attributes={"k": "v"}, group_id="g")
    transport.send(QueueName.INPUT, original)
    got = transport.create_consumer(QueueName.INPUT).fetch(1, 0.1)[0]
    got.attributes["k"] = "changed"
    assert original.attributes == {"k": "v"}


def test_nack_later_redelivers_after_the_delay_and_spends_the_handle() -> None:
    clock = ManualClock()
    transport = InMemoryTransport(ack_wait=30, clock=clock)
    transport.send(QueueName.INPUT, QueueMessage(body="b", group_id="g"))
    consumer = transport.create_consumer(QueueName.INPUT)
    first = consumer.fetch(1, 0.05)[0]
    assert consumer.nack_later(first, 5.0) is True
    consumer.extend_lease(first)  # the old handle no longer moves the deadline
    assert consumer.fetch(1, 0.05) == []
    clock.advance(5.0)
    again = consumer.fetch(1, 0.05)
    assert [m.receive_count for m in again] == [2]
    consumer.ack(first)  # stale: must not remove the redelivered copy
    assert transport.in_flight(QueueName.INPUT) == 1


def test_purge_returns_queued_and_in_flight_messages() -> None:
    transport = InMemoryTransport()
    for body in ("a", "b", "c"):
        transport.send(QueueName.INPUT, QueueMessage(body=body, group_id="g"))
    consumer = transport.create_consumer(QueueName.INPUT)
    held = consumer.fetch(1, 0.05)[0]
    assert (transport.depth(QueueName.INPUT), transport.in_flight(QueueName.INPUT)) == (2, 1)
    assert sorted(m.body for m in transport.purge(QueueName.INPUT)) == ["a", "b", "c"]
    consumer.ack(held)  # a late ack of a purged message is harmless
    assert (transport.depth(QueueName.INPUT), transport.in_flight(QueueName.INPUT)) == (0, 0)
    assert consumer.fetch(1, 0.05) == []
