"""The in-memory transport passes the whole contract suite, with no capability opted out."""

from __future__ import annotations

from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.in_memory import InMemoryTransport, ManualClock


class TestInMemoryTransportContract(QueueTransportContract):
    ack_wait = 30.0
    dedup_window = 300.0

    def make_transport(self) -> QueueTransport:
        self.clock = ManualClock()
        return InMemoryTransport(ack_wait=self.ack_wait, dedup_window=300.0, clock=self.clock)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def open_consumers(self, transport: QueueTransport, queue: QueueName) -> int:
        assert isinstance(transport, InMemoryTransport)
        return transport.open_consumers(queue)


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
