"""An SQS record the Lambda consumers cannot decode is answered, counted and not retried."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from agentkernel.aws import ServerlessAgentRunner
from agentkernel.pipeline.runtime.metrics import METRICS
from tests.aws.lambda_harness import LambdaContext, sqs_event
from tests.aws.test_lambda import d  # noqa: F401 - the deployment fixture

pytestmark = pytest.mark.aws


@pytest.fixture(autouse=True)
def _metrics() -> Iterator[None]:
    METRICS.reset()
    yield
    METRICS.reset()


def test_a_binary_attribute_that_is_not_utf8_is_answered_and_not_retried(d: Any) -> None:  # noqa: F811
    """It was dropped as 'not an SQS record': no reply, so its caller waited for nothing."""
    sqs = boto3.client("sqs")
    sqs.send_message(
        QueueUrl=d.input,
        MessageBody=json.dumps({"session_id": "s", "prompt": "x", "agent": "remember"}),
        MessageGroupId="s",
        MessageDeduplicationId="u1",
        MessageAttributes={
            "request_id": {"DataType": "String", "StringValue": "undecodable-1"},
            "traceparent": {"DataType": "Binary", "BinaryValue": b"\xff\xfe not utf-8"},
        },
    )
    event = sqs_event(d.input)
    assert ServerlessAgentRunner.handle(event, LambdaContext()) == {"batchItemFailures": []}
    [reply] = sqs_event(d.output)["Records"]
    doc = json.loads(reply["body"])
    assert (doc["error"], doc["request_id"]) == ("UNDECODABLE_MESSAGE", "undecodable-1")
    assert "traceparent" in doc["message"]
    assert "agentkernel_undecodable_messages_total" in METRICS.render()
