"""The raw SQS calls behind :class:`~agentkernel.aws.ecs.ECSSQSConsumer`'s ``poll`` and
``delete_message``: records exactly as boto3 returns them, for subclasses written to the guide.

One client per process (boto3 clients are thread-safe), built from ``execution.queues.sqs``
(region, endpoint) on first use. botocore errors become :class:`TransportError`. boto3 is
imported on first use, so importing the ECS classes does not load it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from agentkernel.core.config.queues import SQSQueueConfig
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import TransportError
from agentkernel.core.extras import require_extra
from agentkernel.core.redact import redact_url

#: SQS returns at most this many messages per receive.
MAX_BATCH = 10

_lock = threading.Lock()
_client: Any = None


def _settings() -> SQSQueueConfig:
    return AKConfig.get().execution.queues.sqs or SQSQueueConfig()


def sqs() -> Any:
    """The process's SQS client for raw-record consumers."""
    global _client
    with _lock:
        if _client is None:
            with require_extra("sqs", "ECSSQSConsumer.poll"):
                from agentkernel.core.botocore_errors import client
            settings = _settings()
            _client = client(
                "sqs",
                "execution.queues.sqs",
                region_name=settings.region_name,
                endpoint_url=settings.endpoint_url,
            )
        return _client


def reset() -> None:
    """Forget the client (tests that point the process at another endpoint)."""
    global _client
    with _lock:
        _client = None


def batch_size() -> int:
    """``execution.queues.batch_size`` as SQS takes it (1 to 10)."""
    return max(1, min(AKConfig.get().execution.queues.batch_size or 1, MAX_BATCH))


def receive(queue_url: str) -> list[dict[str, Any]]:
    """One long-poll receive on ``queue_url``: up to :func:`batch_size` raw records, with all
    system attributes (``ApproximateReceiveCount``, ``MessageGroupId``) and message attributes,
    waiting up to ``execution.queues.sqs.wait_time_seconds`` (whole seconds, 20 by default).

    Raises:
        TransportError: SQS refused or could not be reached.
    """
    with _errors(f"SQS receive_message on {redact_url(queue_url)}"):
        reply = sqs().receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=batch_size(),
            WaitTimeSeconds=int(_settings().wait_time_seconds),
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
    return list(reply.get("Messages", []))


def delete(queue_url: str, record: dict[str, Any]) -> None:
    """Delete a received ``record`` from ``queue_url`` by its receipt handle.

    Raises:
        TransportError: SQS refused (a stale receipt handle, a missing queue) or could not be
            reached.
        ValueError: ``record`` has no receipt handle (it was not received from SQS).
    """
    handle = record.get("ReceiptHandle") if isinstance(record, dict) else None
    if not isinstance(handle, str) or not handle:
        raise ValueError("delete_message() needs a record received from SQS (no ReceiptHandle)")
    with _errors(f"SQS delete_message on {redact_url(queue_url)}"):
        sqs().delete_message(QueueUrl=queue_url, ReceiptHandle=handle)


@contextlib.contextmanager
def _errors(operation: str) -> Iterator[None]:
    """botocore's exceptions in the block as :class:`TransportError` (chained)."""
    from agentkernel.core.botocore_errors import botocore_errors

    with botocore_errors(operation, unavailable=TransportError, failed=TransportError):
        yield
