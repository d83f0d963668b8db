"""Publish messages the transports cannot decode, natively (bypassing ``send``), per broker.

Each ``publish_*`` returns the request id the message still carries once received, or ``None``
when its kind makes it unreadable.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from agentkernel.pipeline.transport.kafka import KafkaTransport
from agentkernel.pipeline.transport.kafka.partitions import ATTR_PREFIX
from agentkernel.pipeline.transport.nats import NatsTransport, partition_of
from agentkernel.pipeline.transport.nats.envelope import ENVELOPE_HEADER
from agentkernel.pipeline.transport.redis import RedisStreamsTransport
from agentkernel.pipeline.transport.sqs import SQSTransport
from agentkernel.pipeline.wire.envelope import QueueName

NOT_UTF8 = b"\xff\xfe\xc3("

NATS_KINDS = ("body", "envelope-base64", "envelope-json", "envelope-types")
KAFKA_KINDS = ("key", "header", "value")
SQS_KINDS = ("binary-attribute",)


def _turn(group: str) -> bytes:
    return json.dumps({"session_id": group, "prompt": "foreign"}).encode()


def publish_nats(
    transport: NatsTransport, queue: QueueName, kind: str, group: str, request_id: str
) -> str | None:
    stream, prefix = transport.streams[queue]
    envelope = {"g": group, "a": {"request_id": request_id}}
    header = base64.b64encode(json.dumps(envelope).encode()).decode()
    body, keeps = _turn(group), request_id
    if kind == "body":
        body = NOT_UTF8
    elif kind == "envelope-base64":
        header, keeps = "%%% not base64 %%%", None
    elif kind == "envelope-json":
        header, keeps = base64.b64encode(b"{not json").decode(), None
    elif kind == "envelope-types":
        wrong = {"g": 5, "a": {"request_id": 7}}
        header, keeps = base64.b64encode(json.dumps(wrong).encode()).decode(), None
    subject = f"{prefix}.{partition_of(group, transport.settings.partitions)}"
    publish = transport.conn.js.publish(
        subject, body, headers={ENVELOPE_HEADER: header}, stream=stream
    )
    transport.run(publish)
    return keeps


def publish_kafka(
    transport: KafkaTransport, queue: QueueName, kind: str, group: str, request_id: str
) -> str | None:
    key, value = group.encode(), _turn(group)
    headers: list[Any] = [(ATTR_PREFIX + "request_id", request_id.encode())]
    if kind == "key":
        key = NOT_UTF8
    elif kind == "header":
        headers.append((ATTR_PREFIX + "user_id", NOT_UTF8))
    elif kind == "value":
        value = NOT_UTF8
    transport.produce(transport.topics[queue], value, key, headers)
    return request_id


def publish_sqs(
    transport: SQSTransport, queue: QueueName, kind: str, group: str, request_id: str
) -> str | None:
    assert kind == "binary-attribute"
    transport.client().send_message(
        QueueUrl=transport.urls[queue],
        MessageBody=_turn(group).decode(),
        MessageGroupId=group,
        MessageDeduplicationId=f"foreign-{request_id}",
        MessageAttributes={
            "request_id": {"DataType": "String", "StringValue": request_id},
            "user_id": {"DataType": "Binary", "BinaryValue": NOT_UTF8},
        },
    )
    return request_id


REDIS_KINDS = ("body", "no-body", "attributes-json", "attributes-types")


def publish_redis(
    transport: RedisStreamsTransport, queue: QueueName, kind: str, group: str, request_id: str
) -> str | None:
    """Append an entry to the session's stream as another client would (with the token the
    layout asks for when the session had none)."""
    keys = transport.queues[queue]
    attributes = json.dumps({"request_id": request_id})
    fields: dict[str, bytes | str] = {"b": _turn(group), "a": attributes}
    keeps: str | None = request_id
    if kind == "body":
        fields["b"] = NOT_UTF8
    elif kind == "no-body":
        del fields["b"]
    elif kind == "attributes-json":
        fields["a"], keeps = b"{not json", None
    elif kind == "attributes-types":
        fields["a"] = json.dumps({"request_id": request_id, "user_id": 7})
    flat = [x for pair in fields.items() for x in pair]
    transport.client.eval(_FOREIGN_ADD, 2, keys.session(group.encode()), keys.ready, group, *flat)
    return keeps


#: Another client that knows the layout: the entry and, for a session that had none, its token,
#: atomically (the transport may hand the session on meanwhile).
_FOREIGN_ADD = """
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
if redis.call('XLEN', KEYS[1]) == 1 then redis.call('XADD', KEYS[2], '*', 's', ARGV[1]) end
"""
