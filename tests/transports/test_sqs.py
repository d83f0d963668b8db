"""The SQS transport against a real moto server."""

from __future__ import annotations

import time
import uuid

import boto3
import pytest

from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.errors import AKConfigError, MessageRejectedError
from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.transport.sqs import SQSTransport, lease_param, wait_param
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.foreign import NOT_UTF8, SQS_KINDS, publish_sqs

pytestmark = pytest.mark.aws


def create_fifo(
    name: str, visibility: int = 2, redrive_to: str | None = None, max_receive: int = 4
) -> str:
    sqs = boto3.client("sqs")
    attributes = {"FifoQueue": "true", "VisibilityTimeout": str(visibility)}
    if redrive_to:
        arn = sqs.get_queue_attributes(QueueUrl=redrive_to, AttributeNames=["QueueArn"])
        attributes["RedrivePolicy"] = (
            f'{{"deadLetterTargetArn": "{arn["Attributes"]["QueueArn"]}", '
            f'"maxReceiveCount": "{max_receive}"}}'
        )
    return str(sqs.create_queue(QueueName=f"{name}.fifo", Attributes=attributes)["QueueUrl"])


def fresh_transport(visibility: int = 2, **kw: object) -> SQSTransport:
    tag = uuid.uuid4().hex[:12]
    return SQSTransport(
        create_fifo(f"in-{tag}", visibility),
        create_fifo(f"out-{tag}", visibility),
        wait_time_seconds=1,
        **kw,
    )  # type: ignore[arg-type]


@pytest.mark.usefixtures("aws")
class TestSQSTransportContract(QueueTransportContract):
    ack_wait = 2.0
    fetch_wait = 8.0
    # SQS's dedup window is fixed at 5 minutes; the contract's "accepted after the window" case
    # would need a 5-minute sleep, so it is declared instead of faked.
    dedup_expiry = False
    # moto still accepts a receipt handle from an earlier delivery (AWS rejects it), so a stale
    # ack would delete the redelivered copy; declared until the tests run against real SQS.
    stale_handle_inert = False
    # (moto's long poll ignores a group's lock taken after it started; tests/moto_server.py makes
    # every long poll a series of serialised short polls, so the contract case runs.)
    # SQS FIFO's SequenceNumber rises per group on AWS, but moto hands out random numbers, so
    # the transport sets no position: a deleted message never comes back, so only a group's
    # latest turn can be delivered again, which the session record's id window recognises.
    positions = False
    undecodable_kinds = SQS_KINDS

    def make_transport(self) -> QueueTransport:
        return fresh_transport(int(self.ack_wait))

    def send_undecodable(
        self, transport: QueueTransport, queue: QueueName, kind: str, group: str, request_id: str
    ) -> str | None:
        assert isinstance(transport, SQSTransport)
        return publish_sqs(transport, queue, kind, group, request_id)


@pytest.mark.usefixtures("aws")
class TestSQSSpecifics:
    def test_too_many_attributes_are_refused_before_sending(self) -> None:
        transport = fresh_transport()
        attrs = {f"a{i}": "v" for i in range(11)}
        with pytest.raises(MessageRejectedError, match="10 message attributes"):
            transport.send(QueueName.INPUT, QueueMessage(body="x", attributes=attrs, group_id="g"))
        assert transport.depth(QueueName.INPUT) == 0

    def test_oversized_message_is_refused_before_sending(self) -> None:
        transport = fresh_transport()
        with pytest.raises(MessageRejectedError, match="SQS allows"):
            transport.send(QueueName.INPUT, QueueMessage(body="x" * (256 * 1024 + 1), group_id="g"))

    def test_missing_queue_fails_fast_naming_it(self) -> None:
        url = create_fifo(f"gone-{uuid.uuid4().hex[:8]}")
        boto3.client("sqs").delete_queue(QueueUrl=url)
        transport = SQSTransport(url, url)
        with pytest.raises(AKConfigError, match="does not exist"):
            transport.create_consumer(QueueName.INPUT)

    def test_dead_letter_hands_the_message_to_the_redrive_policy(self) -> None:
        tag = uuid.uuid4().hex[:8]
        dlq = create_fifo(f"dlq-{tag}")
        source = create_fifo(f"src-{tag}", visibility=30, redrive_to=dlq, max_receive=1)
        transport = SQSTransport(source, create_fifo(f"o-{tag}"), wait_time_seconds=1)
        transport.send(QueueName.INPUT, QueueMessage(body="poison", group_id="g"))
        consumer = transport.create_consumer(QueueName.INPUT)
        consumer.dead_letter(consumer.fetch(1, 1)[0])
        assert consumer.fetch(1, 1) == []  # the next receive moves it to the DLQ
        moved = boto3.client("sqs").receive_message(QueueUrl=dlq, WaitTimeSeconds=1)
        assert [m["Body"] for m in moved.get("Messages", [])] == ["poison"]

    def test_an_undecodable_message_is_copied_to_the_dlq_at_once(self) -> None:
        """Handed back to the redrive policy, it would be delivered (and refused) again up to
        maxReceiveCount times; it is copied to the DLQ, as it was, and deleted instead."""
        tag = uuid.uuid4().hex[:10]
        dlq = create_fifo(f"dlq-{tag}")
        source = create_fifo(f"src-{tag}", visibility=1, redrive_to=dlq, max_receive=4)
        transport = SQSTransport(source, create_fifo(f"o-{tag}"), wait_time_seconds=1)
        publish_sqs(transport, QueueName.INPUT, "binary-attribute", "g", "r-1")
        consumer = transport.create_consumer(QueueName.INPUT)
        [foreign] = consumer.fetch(1, 1)
        assert foreign.undecodable and foreign.attributes["request_id"] == "r-1"
        consumer.dead_letter(foreign)
        time.sleep(1.5)  # past the visibility timeout: a handed-back message would be back
        assert consumer.fetch(1, 1) == []
        moved = boto3.client("sqs").receive_message(
            QueueUrl=dlq, WaitTimeSeconds=1, MessageAttributeNames=["All"]
        )
        [copy] = moved.get("Messages", [])
        assert copy["MessageAttributes"]["user_id"]["BinaryValue"] == NOT_UTF8

    def test_factory_builds_sqs_from_the_guide_variables(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        transport = fresh_transport()
        monkeypatch.setenv("AK_EXECUTION__QUEUES__TYPE", "sqs")
        monkeypatch.setenv("AK_EXECUTION__QUEUES__INPUT__URL", transport.urls[QueueName.INPUT])
        monkeypatch.setenv("AK_EXECUTION__QUEUES__OUTPUT__URL", transport.urls[QueueName.OUTPUT])
        built = QueueTransportFactory.create()
        assert isinstance(built, SQSTransport) and built.urls == transport.urls


def test_leases_round_up_and_waits_round_down_to_whole_seconds() -> None:
    leases = [0.2, 1.0, 1.0000001, 2.5, 29.9999999, 50000.0]
    assert [lease_param(x) for x in leases] == [1, 1, 1, 3, 30, 43200]
    assert [wait_param(x) for x in [0.0, 0.5, 0.9999999, 1.9, 25.0]] == [0, 0, 1, 1, 20]


@pytest.mark.usefixtures("aws")
class TestSQSLeases:
    def test_a_fractional_visibility_timeout_is_not_truncated_to_zero(self) -> None:
        transport = fresh_transport(visibility=30, visibility_timeout=0.5)
        transport.send(QueueName.INPUT, QueueMessage(body="m", group_id="g"))
        first = transport.create_consumer(QueueName.INPUT)
        assert [m.receive_count for m in first.fetch(1, 1)] == [1]
        other = transport.create_consumer(QueueName.INPUT)
        assert other.fetch(1, 0) == []  # int(0.5) == 0 made it visible to everyone at once
        assert first.lease_seconds == 1.0
        time.sleep(1.3)
        assert [m.receive_count for m in other.fetch(1, 1)] == [2]

    def test_the_configured_lease_defaults_to_30_seconds(self) -> None:
        transport = fresh_transport(visibility=2)
        urls = {"input": {"url": transport.urls[QueueName.INPUT]}}
        urls["output"] = {"url": transport.urls[QueueName.OUTPUT]}
        block = QueuesConfig.model_validate({"type": "sqs", "sqs": {}, **urls})
        built = SQSTransport.from_config(block).create_consumer(QueueName.INPUT)
        assert built.lease_seconds == 30.0
        queue_own = QueuesConfig.model_validate(
            {"type": "sqs", "sqs": {"visibility_timeout": None}, **urls}
        )
        assert (
            SQSTransport.from_config(queue_own).create_consumer(QueueName.INPUT).lease_seconds == 2
        )

    def test_a_delayed_nack_rounds_a_fraction_up_not_down_to_zero(self) -> None:
        transport = fresh_transport(visibility=30)
        transport.send(QueueName.INPUT, QueueMessage(body="m", group_id="g"))
        consumer = transport.create_consumer(QueueName.INPUT)
        (first,) = consumer.fetch(1, 1)
        assert consumer.nack_later(first, 0.4) is True
        assert consumer.fetch(1, 0) == []  # 0.4 s truncated to 0 would show it at once
        time.sleep(1.3)
        assert [m.receive_count for m in consumer.fetch(1, 1)] == [2]

    def test_a_delayed_nack_past_twelve_hours_is_capped_not_refused(self) -> None:
        transport = fresh_transport(visibility=2)
        transport.send(QueueName.INPUT, QueueMessage(body="m", group_id="g"))
        consumer = transport.create_consumer(QueueName.INPUT)
        (first,) = consumer.fetch(1, 1)
        time.sleep(1.1)  # SQS counts its 12 hours from the receive: 43200 s now is refused
        assert consumer.nack_later(first, 50_000.0) is True
        time.sleep(1.5)  # past the 2 s lease of the receive: the capped delay still holds it
        assert consumer.fetch(1, 0) == []
