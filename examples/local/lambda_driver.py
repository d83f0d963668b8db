"""Drive the five Lambda handlers on your machine: API Gateway and SQS events built in Python,
SQS and DynamoDB on a moto server, the WebSocket management API on a local HTTP server.

    moto_server -H 127.0.0.1 -p 5000 &
    export AWS_ENDPOINT_URL=http://127.0.0.1:5000 AWS_DEFAULT_REGION=us-east-1 \\
           AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local
    python examples/local/lambda_driver.py

Each step prints what a handler answered. The driver plays what AWS does between the functions:
API Gateway turns a request into an event, an SQS event source mapping reads a batch, calls the
handler and deletes the records it did not report in ``batchItemFailures``.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aws_resources  # examples/local/aws_resources.py: the queues and tables
import boto3

CONNECTIONS_TABLE_KEY = "connection_id"
API_KEYS = {"alice": "alice-key-0123456789"}


class Context:
    """The part of the Lambda context object the handlers read."""

    def __init__(self, seconds: float = 30.0) -> None:
        self.deadline, self.aws_request_id = time.monotonic() + seconds, uuid.uuid4().hex

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


def http_event(method: str, path: str, body: Any = None, **extra: Any) -> dict[str, Any]:
    """An HTTP API (payload 2.0) proxy event; ``extra``: ``headers``, ``query``."""
    query: dict[str, str] = extra.get("query") or {}
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "&".join(f"{k}={v}" for k, v in query.items()),
        "headers": {"content-type": "application/json"} | extra.get("headers", {}),
        "queryStringParameters": query or None,
        "requestContext": {
            "http": {"method": method, "path": path, "sourceIp": "127.0.0.1"},
            "requestId": uuid.uuid4().hex,
            "stage": "$default",
        },
        "body": None if body is None else json.dumps(body),
        "isBase64Encoded": False,
    }


def socket_event(kind: str, connection: str, body: Any = None, **extra: Any) -> dict[str, Any]:
    """A WebSocket API event: ``kind`` is CONNECT, MESSAGE or DISCONNECT."""
    route = {"CONNECT": "$connect", "DISCONNECT": "$disconnect"}.get(kind, "$default")
    return {
        "requestContext": {
            "routeKey": route,
            "eventType": kind,
            "connectionId": connection,
            "domainName": "local.execute-api.us-east-1.amazonaws.com",
            "stage": "local",
            "requestId": uuid.uuid4().hex,
        },
        "queryStringParameters": extra.get("query"),
        "headers": extra.get("headers"),
        "body": None if body is None else json.dumps(body),
        "isBase64Encoded": False,
    }


def deliver(queue_url: str, handler: Any) -> dict[str, Any]:
    """What an SQS event source mapping does: one batch to ``handler``, then settle it."""
    sqs = boto3.client("sqs")
    received = sqs.receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=1,
        AttributeNames=["All"],
        MessageAttributeNames=["All"],
    ).get("Messages", [])
    arn = "arn:aws:sqs:us-east-1:000000000000:" + queue_url.rsplit("/", 1)[-1]
    event = {"Records": [_record(m, arn) for m in received]}
    result: dict[str, Any] = handler(event, Context())
    failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
    for message in received:
        if message["MessageId"] not in failed:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return result | {"records": len(received)}


def _record(message: dict[str, Any], arn: str) -> dict[str, Any]:
    attributes = {
        name: {"dataType": value["DataType"], "stringValue": value.get("StringValue")}
        | (
            {"binaryValue": base64.b64encode(value["BinaryValue"]).decode()}
            if "BinaryValue" in value
            else {}
        )
        for name, value in (message.get("MessageAttributes") or {}).items()
    }
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message.get("Attributes") or {},
        "messageAttributes": attributes,
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
    }


class ManagementAPI:
    """A local ``@connections`` endpoint: the frames the response handler pushes."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        frames = self.frames

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                frames.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def configure(name: str, management_url: str) -> dict[str, str]:
    """Create the resources and export the variables the functions read (before they start)."""
    env = aws_resources.main(name)
    connections = aws_resources.table(
        boto3.client("dynamodb"), f"{name}-ws-connections", CONNECTIONS_TABLE_KEY
    )
    env |= {
        "AK_API__WEBSOCKET__CONNECTIONS_TABLE": connections,
        "AWS_ENDPOINT_URL_APIGATEWAYMANAGEMENTAPI": management_url,
    }
    os.environ.update(env)
    return env


def step(title: str, answer: Any) -> Any:
    print(f"{title}: {json.dumps(answer)}", flush=True)
    return answer


def main() -> None:
    management = ManagementAPI()
    env = configure(f"local-{uuid.uuid4().hex[:6]}", management.url)
    # Imported once the variables are set: each handler reads its configuration on first use.
    from agentkernel import Agent, Module
    from agentkernel.auth import ApiKeyValidator
    from agentkernel.aws import (
        Lambda,
        ResponseHandler,
        ServerlessAgentRunner,
        ServerlessStreamAgentRunner,
        WebsocketConnectionHandler,
    )

    async def remember(turn: Any) -> str:
        seen = turn.state.setdefault("seen", [])
        seen.append(turn.prompt)
        return f"turn {len(seen)}: {', '.join(seen)}"

    Module([Agent("remember", remember)])
    input_url, output_url = (
        env["AK_EXECUTION__QUEUES__INPUT__URL"],
        env["AK_EXECUTION__QUEUES__OUTPUT__URL"],
    )
    async_post = {"headers": {"prefer": "respond-async"}}

    # 1. request handler -> agent runner -> response handler, then a poll
    body = {"session_id": "demo", "prompt": "hello", "agent": "remember"}
    accepted = step(
        "POST", Lambda.handler(http_event("POST", "/api/v1/chat", body, **async_post), Context())
    )
    request_id = json.loads(accepted["body"])["request_id"]
    step("agent runner", deliver(input_url, ServerlessAgentRunner.handle))
    step("response handler", deliver(output_url, ResponseHandler.handle))
    poll = http_event("GET", "/api/v1/chat/demo", query={"request_id": request_id})
    reply = step("GET", Lambda.handler(poll, Context()))
    assert json.loads(reply["body"])["result"] == "turn 1: hello", reply

    # 2. the stream runner: the same turn path, every reply sent as chunks, then the reply
    body |= {"prompt": "again"}
    accepted = step(
        "POST", Lambda.handler(http_event("POST", "/api/v1/chat", body, **async_post), Context())
    )
    request_id = json.loads(accepted["body"])["request_id"]
    step("stream agent runner", deliver(input_url, ServerlessStreamAgentRunner.handle))
    step("response handler", deliver(output_url, ResponseHandler.handle))
    poll = http_event("GET", "/api/v1/chat/demo", query={"request_id": request_id})
    reply = step("GET", Lambda.handler(poll, Context()))
    assert json.loads(reply["body"])["result"] == "turn 2: hello, again", reply

    # 3. the connection handler and a WebSocket turn, pushed back to the connection
    connections = WebsocketConnectionHandler.set_auth_validator(ApiKeyValidator(API_KEYS))
    refused = step(
        "$connect without a token", connections.handler(socket_event("CONNECT", "c1"), Context())
    )
    assert refused["statusCode"] == 401, refused
    token = {"query": {"token": API_KEYS["alice"]}}
    step("$connect", connections.handler(socket_event("CONNECT", "c1", **token), Context()))
    frame = {"route": "chat", "body": {"session_id": "ws", "prompt": "hi", "agent": "remember"}}
    step("$default", Lambda.handler(socket_event("MESSAGE", "c1", frame), Context()))
    step("agent runner", deliver(input_url, ServerlessAgentRunner.handle))
    step("response handler", deliver(output_url, ResponseHandler.handle))
    step("pushed to c1", management.frames)
    assert management.frames[-1]["type"] == "CHAT_RESPONSE", management.frames
    step("$disconnect", connections.handler(socket_event("DISCONNECT", "c1"), Context()))
    management.server.shutdown()
    print("all five handlers answered", flush=True)


if __name__ == "__main__":
    main()
