"""A ``QueueConsumer`` written to the guide (class methods over a broker's raw records) runs on
the one consumer loop; raw records of every shape reach it as they came."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import pytest

from agentkernel.pipeline import QueueConsumer
from agentkernel.pipeline.consumer.records import RecordConsumer, record_loop, record_message
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


class Inbox(QueueConsumer):
    """Polls an in-memory queue by hand: its raw records are the broker's own messages."""

    max_receive_count = 2
    num_consumers = 2
    broker: ClassVar[TransportConsumer]
    notes: ClassVar[list[tuple[str, str, int]]] = []

    @classmethod
    def poll(cls) -> list[Any]:
        return cls.broker.fetch(5, 0.2)

    @classmethod
    def delete_message(cls, record: Any) -> None:
        cls.broker.ack(record)

    @classmethod
    def process_message(cls, record: Any) -> None:
        if record.body == "poison":
            raise RuntimeError("cannot handle it")
        cls.notes.append(("processed", record.body, record.receive_count))

    @classmethod
    async def on_permanent_failure(cls, record: Any) -> None:
        cls.notes.append(("permanent_failure", record.body, record.receive_count))


def test_a_queue_consumer_written_to_the_guide_runs_on_the_consumer_loop() -> None:
    transport = InMemoryTransport(ack_wait=0.3)
    Inbox.broker, Inbox.notes = transport.create_consumer(QueueName.INPUT), []
    for body, group in [("a", "s1"), ("b", "s1"), ("poison", "s2"), ("c", "s3")]:
        transport.send(QueueName.INPUT, QueueMessage(body=body, group_id=group))
    stop = threading.Event()
    loop = record_loop(Inbox, stop)
    runner = threading.Thread(target=loop.run, kwargs={"exit_on_shutdown": False})
    runner.start()
    try:
        deadline = time.monotonic() + 15
        while len(Inbox.notes) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        runner.join(30)
    assert not runner.is_alive()
    processed = [(body, n) for kind, body, n in Inbox.notes if kind == "processed"]
    assert sorted(processed) == [("a", 1), ("b", 1), ("c", 1)]
    assert processed.index(("a", 1)) < processed.index(("b", 1))  # one session in order
    assert ("permanent_failure", "poison", 3) in Inbox.notes  # past max_receive_count 2
    assert (transport.depth(QueueName.INPUT), transport.in_flight(QueueName.INPUT)) == (0, 0)


def test_records_as_boto3_and_as_lambda_give_the_loop_what_it_needs() -> None:
    boto3_record = {
        "MessageId": "m1",
        "ReceiptHandle": "h",
        "Body": '{"x": 1}',
        "Attributes": {"ApproximateReceiveCount": "4", "MessageGroupId": "s1"},
        "MessageAttributes": {"request_id": {"DataType": "String", "StringValue": "r1"}},
    }
    lambda_record = {
        "messageId": "m2",
        "body": "b",
        "attributes": {"ApproximateReceiveCount": "2", "MessageGroupId": "s2"},
        "messageAttributes": {"request_id": {"dataType": "String", "stringValue": "r2"}},
    }
    one, two = record_message(boto3_record), record_message(lambda_record)
    assert (one.message_id, one.group_id, one.receive_count, one.body) == (
        "m1",
        "s1",
        4,
        '{"x": 1}',
    )
    assert one.attributes == {"request_id": "r1"} and one.native is boto3_record
    assert (two.message_id, two.group_id, two.receive_count) == ("m2", "s2", 2)
    assert two.attributes == {"request_id": "r2"} and two.native is lambda_record


@pytest.mark.parametrize(
    "record",
    [
        None,
        "text",
        42,
        [],
        {},
        {"Attributes": "x", "MessageAttributes": [1], "Body": 5, "MessageId": 7},
        {"Attributes": {"ApproximateReceiveCount": "9" * 5000, "MessageGroupId": 3}},
        {"Attributes": {"ApproximateReceiveCount": "-2"}},
        {"Attributes": {"ApproximateReceiveCount": None}},
        {"MessageAttributes": {"a": {"DataType": "Binary", "BinaryValue": b"\xff"}, 3: {}}},
    ],
)
def test_a_hostile_record_is_still_handed_over_never_raising(record: Any) -> None:
    message = record_message(record)
    assert message.native is record
    assert message.receive_count == 1 and message.group_id is None
    assert isinstance(message.body, str) and message.attributes == {}


def test_an_empty_short_poll_does_not_spin() -> None:
    class Empty(Inbox):
        polls: ClassVar[int] = 0

        @classmethod
        def poll(cls) -> list[Any]:
            cls.polls += 1
            return []

    started = time.monotonic()
    assert RecordConsumer(Empty).fetch(10, 0.3) == []
    assert time.monotonic() - started >= 0.25 and Empty.polls == 1


@pytest.mark.parametrize("bad", [0, -3, 2.5, "2", None, True])
def test_run_refuses_a_consumer_count_it_cannot_start(
    bad: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Inbox, "num_consumers", bad)
    with pytest.raises(ValueError, match=r"Inbox\.num_consumers must be a whole number >= 1"):
        Inbox.run()
