"""Amazon SQS FIFO queues: the broker whose semantics the pipeline was modelled on.

Mapping: ``group_id`` -> ``MessageGroupId`` (one in flight per group, natively),
``dedup_id`` -> ``MessageDeduplicationId`` (SQS's fixed 5-minute window), attributes -> String
message attributes, ``ApproximateReceiveCount`` -> ``receive_count``, lease -> visibility timeout
(``nack`` sets it to 0, ``extend_lease`` restarts it). ``dead_letter`` hands the message back to
the queue's redrive policy when it has one (so SQS moves it to the DLQ), and deletes it otherwise;
a message that cannot be decoded (a binary attribute that is not UTF-8) is copied to that DLQ at
once and deleted, so it is not delivered again before SQS would move it.

Limits are checked before sending: at most 10 attributes and 256 KiB per message. SQS rejects
empty attribute values, so an empty value travels with the custom data type ``String.empty``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.config import Config

from agentkernel.core.botocore_errors import botocore_errors, error_code
from agentkernel.core.config.queues import QueuesConfig, SQSQueueConfig
from agentkernel.core.errors import (
    AKConfigError,
    MessageRejectedError,
    TransportClosedError,
    TransportError,
)
from agentkernel.core.redact import redact_url
from agentkernel.pipeline.transport.base import require_queue_urls
from agentkernel.pipeline.transport.blocking import BlockingConsumer, BlockingTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)

MAX_ATTRIBUTES = 10
MAX_WAIT_SECONDS = 20
MAX_VISIBILITY_SECONDS = 43200
_FLOAT_SLACK = 1e-6  # 2.9999999 computed from floats still means 3 s
SHORT_POLL_IDLE_SECONDS = 0.2
MAX_MESSAGE_BYTES = 256 * 1024
EMPTY_TYPE = "String.empty"
CONNECT_TIMEOUT_SECONDS = 5.0
_errors = functools.partial(botocore_errors, unavailable=TransportError, failed=TransportError)
_STALE_HANDLE_CODES = {"ReceiptHandleIsInvalid", "InvalidParameterValue", "MessageNotInflight"}


def _client(region_name: str | None, endpoint_url: str | None) -> Any:
    # A connection not made within 5 s fails (three tries), instead of botocore's 60 s each:
    # an unreachable endpoint costs seconds, at start-up and in an outage alike.
    config = Config(
        retries={"max_attempts": 3, "mode": "standard"},
        max_pool_connections=50,
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
    )
    return boto3.client("sqs", region_name=region_name, endpoint_url=endpoint_url, config=config)


def lease_param(seconds: float) -> int:
    """A visibility timeout in the whole seconds SQS takes, rounded up: a shorter lease would let
    another consumer receive the message while it is still being handled."""
    return min(MAX_VISIBILITY_SECONDS, max(0, math.ceil(seconds - _FLOAT_SLACK)))


def wait_param(seconds: float) -> int:
    """A long-poll wait in whole seconds, rounded down: a receive must not outlast the wait the
    caller asked for (the remainder is slept after an empty short poll)."""
    return min(MAX_WAIT_SECONDS, max(0, math.floor(seconds + _FLOAT_SLACK)))


def encode_attributes(attributes: dict[str, str]) -> dict[str, dict[str, str]]:
    """Attributes as SQS message attributes.

    Raises:
        MessageRejectedError: more than 10 attributes.
    """
    if len(attributes) > MAX_ATTRIBUTES:
        raise MessageRejectedError(
            f"SQS allows {MAX_ATTRIBUTES} message attributes, got {len(attributes)}"
        )
    return {
        name: {"DataType": EMPTY_TYPE, "StringValue": "-"}
        if value == ""
        else {"DataType": "String", "StringValue": value}
        for name, value in attributes.items()
    }


def decode_attributes(
    raw: dict[str, dict[str, Any]], defects: list[str] | None = None
) -> dict[str, str]:
    """SQS message attributes back to plain strings.

    A binary attribute that is not UTF-8 is left out and noted in ``defects`` (when given).
    """
    out = {}
    for name, attr in raw.items():
        kind = attr.get("DataType", "String")
        if kind == EMPTY_TYPE:
            out[name] = ""
        elif kind.startswith("Binary"):
            try:
                out[name] = bytes(attr.get("BinaryValue", b"")).decode()
            except UnicodeDecodeError:
                if defects is not None:
                    defects.append(f"binary attribute {name!r} is not UTF-8")
        else:
            out[name] = str(attr.get("StringValue", ""))
    return out


def message_size(body: str, attributes: dict[str, dict[str, str]]) -> int:
    """Bytes SQS counts towards its 256 KiB limit: body plus attribute names, types, values."""
    size = len(body.encode())
    for name, attr in attributes.items():
        size += len(name.encode()) + len(attr["DataType"].encode())
        size += len(attr["StringValue"].encode())
    return size


class SQSTransport(BlockingTransport):
    """INPUT and OUTPUT on two SQS FIFO queues.

    Args:
        input_url: URL of the INPUT queue.
        output_url: URL of the OUTPUT queue.
        region_name: AWS region; default from the environment.
        endpoint_url: override the endpoint (``AWS_ENDPOINT_URL`` works too).
        wait_time_seconds: longest long poll per receive call (0-20).
        visibility_timeout: lease in seconds, rounded up to whole seconds; default each queue's
            own setting (``execution.queues.sqs.visibility_timeout`` defaults to 30 s).
    """

    def __init__(
        self,
        input_url: str,
        output_url: str,
        *,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        wait_time_seconds: float = 20.0,
        visibility_timeout: float | None = None,
    ) -> None:
        self.urls = {QueueName.INPUT: input_url, QueueName.OUTPUT: output_url}
        self.region_name = region_name
        self.endpoint_url = endpoint_url
        self.wait_time_seconds = wait_time_seconds
        self.visibility_timeout = visibility_timeout
        self._sender: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, block: QueuesConfig) -> SQSTransport:
        """Build from ``execution.queues``; both queue URLs are required."""
        input_url, output_url = require_queue_urls(block, "sqs")
        sqs = block.sqs or SQSQueueConfig()
        return cls(
            input_url,
            output_url,
            region_name=sqs.region_name,
            endpoint_url=sqs.endpoint_url,
            wait_time_seconds=sqs.wait_time_seconds,
            visibility_timeout=sqs.visibility_timeout,
        )

    def client(self) -> Any:
        """The shared sending client (boto3 clients are thread-safe)."""
        with self._lock:
            if self._sender is None:
                self._sender = _client(self.region_name, self.endpoint_url)
            return self._sender

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        attributes = encode_attributes(message.attributes)
        if (size := message_size(message.body, attributes)) > MAX_MESSAGE_BYTES:
            raise MessageRejectedError(f"message is {size} bytes; SQS allows {MAX_MESSAGE_BYTES}")
        kwargs: dict[str, Any] = {
            "QueueUrl": self.urls[queue],
            "MessageBody": message.body,
            "MessageGroupId": message.group_id or uuid.uuid4().hex,
            "MessageDeduplicationId": message.dedup_id or uuid.uuid4().hex,
        }
        if attributes:
            kwargs["MessageAttributes"] = attributes
        with _queue_errors("send_message", self.urls[queue]):
            return str(self.client().send_message(**kwargs)["MessageId"])

    def create_consumer(self, queue: QueueName) -> SQSConsumer:
        return SQSConsumer(self, QueueName(queue))

    def queue_attributes(self, queue: QueueName, *names: str) -> dict[str, str]:
        """Read attributes of a queue (fails fast with the queue's URL when it is missing)."""
        with _queue_errors("get_queue_attributes", self.urls[queue]):
            reply = self.client().get_queue_attributes(
                QueueUrl=self.urls[queue], AttributeNames=list(names)
            )
        return dict(reply.get("Attributes", {}))

    def depth(self, queue: QueueName) -> int:
        """``ApproximateNumberOfMessages`` of the queue."""
        name = "ApproximateNumberOfMessages"
        return int(self.queue_attributes(queue, name)[name])

    def ping(self) -> None:
        self.check_queues(tuple(QueueName))

    def check_queues(self, queues: tuple[QueueName, ...]) -> None:
        """Read an attribute of each queue: the call each role's policy allows on the queues it
        checks (an Agent Runner may only send to OUTPUT, so it checks INPUT alone)."""
        for queue in queues:
            self.queue_attributes(queue, "QueueArn")


class SQSConsumer(BlockingConsumer):
    """Receives from one SQS queue with its own client."""

    def __init__(self, transport: SQSTransport, queue: QueueName) -> None:
        self._url = transport.urls[queue]
        self._wait = transport.wait_time_seconds
        self.fetch_wait_slice_seconds = transport.wait_time_seconds
        attrs = transport.queue_attributes(queue, "VisibilityTimeout", "RedrivePolicy")
        override = transport.visibility_timeout
        self._override = None if override is None else lease_param(override)
        queue_lease = float(attrs.get("VisibilityTimeout", 30))
        self._lease = float(self._override) if self._override is not None else queue_lease
        self._redrive = str(attrs.get("RedrivePolicy") or "")
        self._dlq_url: str | None = None
        self._client = _client(transport.region_name, transport.endpoint_url)
        self._received: dict[str, float] = {}  # receipt handle -> when it was received
        self._undecodable: dict[str, dict[str, Any]] = {}  # receipt handle -> raw message
        self._closed = False

    @property
    def lease_seconds(self) -> float:
        return self._lease

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        if self._closed:
            raise TransportClosedError(f"SQS consumer of {redact_url(self._url)} is closed")
        kwargs: dict[str, Any] = {
            "QueueUrl": self._url,
            "MaxNumberOfMessages": max(1, min(batch_size, 10)),
            "WaitTimeSeconds": wait_param(min(wait_seconds, self._wait)),
            "MessageAttributeNames": ["All"],
            "MessageSystemAttributeNames": [
                "ApproximateReceiveCount",
                "MessageGroupId",
                "MessageDeduplicationId",
            ],
        }
        if self._override is not None:
            kwargs["VisibilityTimeout"] = self._override
        with _queue_errors("receive_message", self._url):
            reply = self._client.receive_message(**kwargs)
        messages = [self._decode(raw) for raw in reply.get("Messages", [])]
        for m, raw in zip(messages, reply.get("Messages", []), strict=True):
            if m.undecodable:
                self._undecodable[m.native] = raw
        now = time.monotonic()
        self._received.update((m.native, now) for m in messages)
        if not messages and kwargs["WaitTimeSeconds"] == 0 and wait_seconds > 0:
            time.sleep(min(wait_seconds, SHORT_POLL_IDLE_SECONDS))  # short polls must not spin
        return messages

    @staticmethod
    def _decode(raw: dict[str, Any]) -> QueueMessage:
        system = raw.get("Attributes", {})
        defects: list[str] = []
        return QueueMessage(
            body=raw.get("Body", ""),
            attributes=decode_attributes(raw.get("MessageAttributes", {}), defects),
            undecodable="; ".join(defects) or None,
            group_id=system.get("MessageGroupId"),
            dedup_id=system.get("MessageDeduplicationId"),
            receive_count=int(system.get("ApproximateReceiveCount", 1)),
            message_id=raw.get("MessageId"),
            native=raw["ReceiptHandle"],
        )

    def ack(self, message: QueueMessage) -> None:
        self._received.pop(message.native, None)
        self._undecodable.pop(message.native, None)
        self._call("delete_message", message, ReceiptHandle=message.native)

    def nack(self, message: QueueMessage) -> None:
        self._received.pop(message.native, None)
        self._undecodable.pop(message.native, None)
        self._call(
            "change_message_visibility", message, ReceiptHandle=message.native, VisibilityTimeout=0
        )

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        """Hide the message for the delay: its visibility timeout, rounded up to whole seconds
        (never sooner than asked), capped at what is left of the 12 hours SQS allows from the
        receive (it refuses a longer one)."""
        received = self._received.pop(message.native, time.monotonic())
        left = MAX_VISIBILITY_SECONDS - math.ceil(time.monotonic() - received)
        self._call(
            "change_message_visibility",
            message,
            ReceiptHandle=message.native,
            VisibilityTimeout=max(min(lease_param(delay_seconds), left), 0),
        )
        return True

    def extend_lease(self, message: QueueMessage) -> None:
        self._call(
            "change_message_visibility",
            message,
            ReceiptHandle=message.native,
            VisibilityTimeout=lease_param(self._lease),
        )

    def dead_letter(self, message: QueueMessage) -> None:
        """Let the queue's redrive policy move it to the DLQ; without one, delete it.

        An undecodable message is copied to the DLQ now: handed back, it would be delivered
        (and refused) again until SQS moved it.
        """
        raw = self._undecodable.get(message.native)
        if raw is not None and self._redrive:
            self._copy_to_dlq(raw)
        if self._redrive and raw is None:
            self.nack(message)
        else:
            self.ack(message)

    def _copy_to_dlq(self, raw: dict[str, Any]) -> None:
        if self._dlq_url is None:  # built from the ARN: no call, and no permission, to look it up
            arn = str(json.loads(self._redrive)["deadLetterTargetArn"])
            _, _, _, _, account, name = arn.split(":", 5)
            self._dlq_url = f"{str(self._client.meta.endpoint_url).rstrip('/')}/{account}/{name}"
        system = raw.get("Attributes", {})
        kwargs: dict[str, Any] = {"QueueUrl": self._dlq_url, "MessageBody": raw.get("Body", "")}
        if attributes := raw.get("MessageAttributes"):
            kwargs["MessageAttributes"] = attributes
        if self._dlq_url.endswith(".fifo"):
            kwargs["MessageGroupId"] = system.get("MessageGroupId") or "undecodable"
            kwargs["MessageDeduplicationId"] = raw["MessageId"]
        with _errors(f"SQS send_message on {redact_url(self._dlq_url)}"):
            self._client.send_message(**kwargs)

    def _call(self, operation: str, message: QueueMessage, **kwargs: Any) -> None:
        try:
            with _errors(f"SQS {operation} on {redact_url(self._url)}"):
                getattr(self._client, operation)(QueueUrl=self._url, **kwargs)
        except TransportError as exc:
            if error_code(exc.__cause__) not in _STALE_HANDLE_CODES:
                raise
            logger.debug("%s of %s: stale receipt handle", operation, message.message_id)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()


@contextlib.contextmanager
def _queue_errors(operation: str, url: str) -> Iterator[None]:
    """:data:`_errors`, except that a queue that does not exist is a configuration error."""
    url = redact_url(url)
    try:
        with _errors(f"SQS {operation} on {url}"):
            yield
    except TransportError as exc:
        code = error_code(exc.__cause__)
        if "NonExistentQueue" not in code and code != "QueueDoesNotExist":
            raise
        raise AKConfigError(
            f"execution.queues: SQS queue {url} does not exist; create it (Terraform "
            "modules/queues) before starting - agentkernel never creates production queues"
        ) from exc.__cause__
