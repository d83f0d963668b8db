"""Real event shapes and real servers for the Lambda handler tests.

- SQS event source mapping: records received from moto's SQS and rewritten the way the mapping
  delivers them (``messageId``, ``receiptHandle``, ``attributes`` with ``ApproximateReceiveCount``
  and ``MessageGroupId``, ``messageAttributes`` with ``stringValue``/``dataType``); records not
  reported in ``batchItemFailures`` are deleted, reported ones made visible again.
- API Gateway events: HTTP API (2.0), REST API (1.0) and WebSocket proxy events.
- A local HTTP server speaking the management API's ``@connections`` routes, recording pushes
  and answering 410 for connections marked gone.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3


def sqs_event(queue_url: str, limit: int = 10, wait: float = 1.0) -> dict[str, Any]:
    sqs = boto3.client("sqs")
    reply = sqs.receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=limit,
        WaitTimeSeconds=int(wait),
        AttributeNames=["All"],
        MessageAttributeNames=["All"],
    )
    arn = "arn:aws:sqs:us-east-1:123456789012:" + queue_url.rsplit("/", 1)[-1]
    return {"Records": [_record(m, arn) for m in reply.get("Messages", [])]}


def _record(m: dict[str, Any], arn: str) -> dict[str, Any]:
    attributes = {  # as Lambda spells them: a binary value base64-encoded
        name: {
            "stringValue": a.get("StringValue"),
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": a["DataType"],
        }
        | (
            {"binaryValue": base64.b64encode(a["BinaryValue"]).decode()}
            if "BinaryValue" in a
            else {}
        )
        for name, a in (m.get("MessageAttributes") or {}).items()
    }
    return {
        "messageId": m["MessageId"],
        "receiptHandle": m["ReceiptHandle"],
        "body": m["Body"],
        "attributes": dict(m.get("Attributes") or {}),
        "messageAttributes": attributes,
        "md5OfBody": m.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": "us-east-1",
    }


def settle(queue_url: str, event: dict[str, Any], result: dict[str, Any]) -> None:
    """What the event source mapping does with a handler's answer."""
    sqs = boto3.client("sqs")
    failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
    for record in event["Records"]:
        if record["messageId"] in failed:
            sqs.change_message_visibility(
                QueueUrl=queue_url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
            )
        else:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=record["receiptHandle"])


def pump(queue_url: str, handler: Any, rounds: int = 1) -> list[dict[str, Any]]:
    """Feed ``rounds`` batches of ``queue_url`` to ``handler``; returns its answers."""
    answers = []
    for _ in range(rounds):
        event = sqs_event(queue_url)
        if not event["Records"]:
            continue
        result = handler(event, LambdaContext())
        settle(queue_url, event, result)
        answers.append(result)
    return answers


class Pumper:
    """Runs the agent runner and response handler functions on their queues in the background."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for url, handler in self.pairs:
                pump(url, handler)

    def __enter__(self) -> Pumper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


class LambdaContext:
    """The part of the Lambda context object the handlers read."""

    def __init__(self, remaining_seconds: float = 30.0) -> None:
        self.deadline = time.monotonic() + remaining_seconds
        self.aws_request_id = uuid.uuid4().hex

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


def _raw(body: Any, b64: bool) -> str | None:
    """An event's ``body``: JSON text of ``body`` (a string as it is), base64 when ``b64``."""
    raw = None if body is None else (body if isinstance(body, str) else json.dumps(body))
    return base64.b64encode(raw.encode()).decode() if b64 and raw is not None else raw


def http_v2(
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
    b64: bool = False,
) -> dict[str, Any]:
    raw = _raw(body, b64)
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "&".join(f"{k}={v}" for k, v in (query or {}).items()),
        "headers": {"content-type": "application/json"} | (headers or {}),
        "queryStringParameters": query,
        "requestContext": {
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
            },
            "requestId": uuid.uuid4().hex,
            "stage": "$default",
        },
        "body": raw,
        "isBase64Encoded": b64,
    }


def rest_v1(
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
    b64: bool = False,
) -> dict[str, Any]:
    raw = _raw(body, b64)
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"} | (headers or {}),
        "multiValueHeaders": {},
        "queryStringParameters": query,
        "requestContext": {"httpMethod": method, "path": f"/prod{path}", "stage": "prod"},
        "body": raw,
        "isBase64Encoded": b64,
    }


def websocket(
    event_type: str,
    connection_id: str,
    body: Any = None,
    route: str | None = None,
    query: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    route = route or {"CONNECT": "$connect", "DISCONNECT": "$disconnect"}.get(
        event_type, "$default"
    )
    return {
        "requestContext": {
            "routeKey": route,
            "eventType": event_type,
            "connectionId": connection_id,
            "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
            "stage": "prod",
            "apiId": "abc123",
            "requestId": uuid.uuid4().hex,
        },
        "queryStringParameters": query,
        "headers": headers,
        "body": None if body is None else (body if isinstance(body, str) else json.dumps(body)),
        "isBase64Encoded": False,
    }


class ManagementAPI:
    """A local ``@connections`` endpoint: records pushed frames, answers 410 for gone ids and
    the status ``failing`` gives for others."""

    def __init__(self) -> None:
        self.frames: dict[str, list[dict[str, Any]]] = {}
        self.gone: set[str] = set()
        self.failing: dict[str, int] = {}  # connection id -> HTTP status
        self.closed: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                connection = self.path.rsplit("/", 1)[-1]
                data = self.rfile.read(int(self.headers.get("content-length", 0)))
                if connection in api.gone:
                    self.send_response(410)
                    self.send_header("x-amzn-ErrorType", "GoneException")
                    self.send_header("content-type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"message": "Gone"}')
                    return
                if connection in api.failing:
                    self.send_response(api.failing[connection])
                    self.send_header("x-amzn-ErrorType", "SomeFailure")
                    self.send_header("content-type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"message": "failed"}')
                    return
                api.frames.setdefault(connection, []).append(json.loads(data))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_DELETE(self) -> None:
                api.closed.append(self.path.rsplit("/", 1)[-1])
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, connection: str, count: int, timeout: float = 20) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.frames.get(connection, [])) < count:
            assert time.monotonic() < deadline, f"pushed so far: {self.frames.get(connection)}"
            time.sleep(0.05)
        return self.frames[connection]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
