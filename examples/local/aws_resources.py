"""Create the SQS queues and DynamoDB tables of a split deployment, on a local moto server (or
on AWS), and print the ``AK_`` variables that point agentkernel at them.

    moto_server -H 127.0.0.1 -p 5000 &
    export AWS_ENDPOINT_URL=http://127.0.0.1:5000 AWS_DEFAULT_REGION=us-east-1 \\
           AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local
    python examples/local/aws_resources.py demo > ak.env && set -a && . ./ak.env && set +a

Queues: ``<name>-input.fifo`` (redriven to ``<name>-input-dlq.fifo`` after
``max_receive_count + 1`` receives, as the Terraform does), ``<name>-output.fifo`` (with its own
dead-letter queue). Tables: ``<name>-responses`` (key ``request_id``) and ``<name>-sessions``
(key ``session_id``), both with the TTL attribute ``expiry_time``. Running it again is harmless.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import boto3

MAX_RECEIVE_COUNT = 3
VISIBILITY_SECONDS = 30


def fifo_queue(sqs: Any, name: str, dead_letter: str | None = None) -> str:
    """The URL of FIFO queue ``name`` (created when missing), redriven to ``dead_letter``."""
    attributes = {"FifoQueue": "true", "VisibilityTimeout": str(VISIBILITY_SECONDS)}
    if dead_letter is not None:
        found = sqs.get_queue_attributes(QueueUrl=dead_letter, AttributeNames=["QueueArn"])
        arn = found["Attributes"]["QueueArn"]
        policy = {"deadLetterTargetArn": arn, "maxReceiveCount": str(MAX_RECEIVE_COUNT + 1)}
        attributes["RedrivePolicy"] = json.dumps(policy)
    created = sqs.create_queue(QueueName=f"{name}.fifo", Attributes=attributes)
    return str(created["QueueUrl"])


def table(dynamodb: Any, name: str, key: str) -> str:
    """Create table ``name`` keyed by ``key`` with the stores' TTL attribute (if missing)."""
    try:
        dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    except dynamodb.exceptions.ResourceInUseException:
        return name
    dynamodb.get_waiter("table_exists").wait(TableName=name)
    dynamodb.update_time_to_live(
        TableName=name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiry_time"},
    )
    return name


def main(name: str) -> dict[str, str]:
    """Create everything for deployment ``name``; returns the ``AK_`` variables."""
    sqs, dynamodb = boto3.client("sqs"), boto3.client("dynamodb")
    input_url = fifo_queue(sqs, f"{name}-input", fifo_queue(sqs, f"{name}-input-dlq"))
    output_url = fifo_queue(sqs, f"{name}-output", fifo_queue(sqs, f"{name}-output-dlq"))
    return {
        "AK_EXECUTION__QUEUES__TYPE": "sqs",
        "AK_EXECUTION__QUEUES__INPUT__URL": input_url,
        "AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT": str(MAX_RECEIVE_COUNT),
        "AK_EXECUTION__QUEUES__OUTPUT__URL": output_url,
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "dynamodb",
        "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": table(
            dynamodb, f"{name}-responses", "request_id"
        ),
        "AK_SESSION__TYPE": "dynamodb",
        "AK_SESSION__DYNAMODB__TABLE_NAME": table(dynamodb, f"{name}-sessions", "session_id"),
    }


if __name__ == "__main__":
    for key, value in main(sys.argv[1] if len(sys.argv) > 1 else "demo").items():
        print(f"{key}={value}")
