"""The serverless topology: every Lambda handler invoked with real event shapes against moto's
SQS and DynamoDB and a local API Gateway management endpoint."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from agentkernel import Agent, AgentRegistry, Module, RetryableError
from agentkernel.auth import AuthValidator, ValidationResult
from agentkernel.aws import (
    Lambda,
    ResponseHandler,
    ServerlessAgentRunner,
    ServerlessStreamAgentRunner,
    WebsocketConnectionHandler,
)
from agentkernel.aws.responder import ENDPOINT_ENV
from tests.aws.lambda_harness import (
    LambdaContext,
    ManagementAPI,
    Pumper,
    http_v2,
    pump,
    rest_v1,
    sqs_event,
    websocket,
)
from tests.stores.test_response_stores import create_table
from tests.transports.test_sqs import create_fifo

pytestmark = pytest.mark.aws


async def remember(turn):  # type: ignore[no-untyped-def]
    turn.state.setdefault("seen", []).append(turn.prompt)
    return json.dumps(turn.state["seen"])


async def words(turn):  # type: ignore[no-untyped-def]
    for word in turn.prompt.split():
        await asyncio.sleep(0.01)
        yield word + " "


async def flaky(turn):  # type: ignore[no-untyped-def]
    raise RetryableError("rate limited")


class Deployment:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        tag = uuid.uuid4().hex[:10]
        self.input = create_fifo(f"lin-{tag}", visibility=5)
        self.output = create_fifo(f"lout-{tag}", visibility=5)
        self.table, self.connections = f"resp-{tag}", f"conn-{tag}"
        create_table(self.table, "request_id")
        create_table(self.connections, "connection_id")
        self.management = ManagementAPI()
        for key, value in {
            "AK_EXECUTION__QUEUES__INPUT__URL": self.input,
            "AK_EXECUTION__QUEUES__OUTPUT__URL": self.output,
            "AK_EXECUTION__QUEUES__SQS__WAIT_TIME_SECONDS": "1",
            "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": self.table,
            "AK_API__WEBSOCKET__CONNECTIONS_TABLE": self.connections,
            ENDPOINT_ENV: self.management.url,
        }.items():
            monkeypatch.setenv(key, value)

    def run_turns(self, runner: Any = ServerlessAgentRunner.handle) -> None:
        pump(self.input, runner)
        pump(self.output, ResponseHandler.handle)


@pytest.fixture
def d(aws: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    for cls in (Lambda, ServerlessAgentRunner, ResponseHandler, WebsocketConnectionHandler):
        cls.reset()
    AgentRegistry.reset()
    Module([Agent("remember", remember), Agent("words", words), Agent("flaky", flaky)])
    deployment = Deployment(monkeypatch)
    yield deployment
    deployment.management.close()
    for cls in (Lambda, ServerlessAgentRunner, ResponseHandler, WebsocketConnectionHandler):
        cls.reset()
    AgentRegistry.reset()


def body_of(response: dict[str, Any]) -> Any:
    return json.loads(response["body"])


def chat(session: str, prompt: str, agent: str = "remember") -> dict[str, str]:
    return {"session_id": session, "prompt": prompt, "agent": agent}


# -- a REST turn the whole way -------------------------------------------------------------------


def test_a_sync_rest_turn_goes_the_whole_way(d: Deployment) -> None:
    with Pumper([(d.input, ServerlessAgentRunner.handle), (d.output, ResponseHandler.handle)]):
        first = Lambda.handler(http_v2("POST", "/api/v1/chat", chat("s", "one")), LambdaContext())
        second = Lambda.handler(
            rest_v1("POST", "/api/v1/chat", chat("s", "two"), b64=True), LambdaContext()
        )
    assert (first["statusCode"], json.loads(body_of(first)["result"])) == (200, ["one"])
    assert (second["statusCode"], json.loads(body_of(second)["result"])) == (200, ["one", "two"])


def test_async_post_then_poll(d: Deployment) -> None:
    event = http_v2("POST", "/api/v1/chat", chat("a", "hi"), headers={"prefer": "respond-async"})
    accepted = Lambda.handler(event, LambdaContext())
    assert accepted["statusCode"] == 202
    request_id = body_of(accepted)["request_id"]
    assert accepted["headers"]["Location"] == f"/api/v1/chat/a?request_id={request_id}"
    query = {"request_id": request_id}
    pending = Lambda.handler(http_v2("GET", "/api/v1/chat/a", query=query))
    assert (pending["statusCode"], body_of(pending)["error"]) == (404, "PENDING")
    assert pending["headers"]["Retry-After"] == "1"
    d.run_turns()
    got = Lambda.handler(rest_v1("GET", "/api/v1/chat/a", query=query))
    assert (got["statusCode"], body_of(got)["request_id"]) == (200, request_id)
    other = Lambda.handler(http_v2("GET", "/api/v1/chat/b", query=query))
    assert (other["statusCode"], body_of(other)["error"]) == (404, "NOT_FOUND")


def test_sync_wait_answers_504_before_the_function_runs_out(d: Deployment) -> None:
    response = Lambda.handler(
        http_v2("POST", "/api/v1/chat", chat("t", "nobody runs me")), LambdaContext(1.5)
    )
    assert response["statusCode"] == 504
    assert body_of(response)["request_id"] and "Location" in response["headers"]


def test_routes_health_agents_custom_and_unknown(d: Deployment) -> None:
    @Lambda.register("/app", method="GET")
    def app(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"app": "demo", "path": event["rawPath"]}

    assert body_of(Lambda.handler(http_v2("GET", "/app"))) == {"app": "demo", "path": "/app"}
    assert body_of(Lambda.handler(http_v2("GET", "/health"))) == {"status": "ok"}
    agents = body_of(Lambda.handler(rest_v1("GET", "/api/v1/agents")))
    assert agents["agents"] == ["remember", "words", "flaky"]  # upstream's shape: the names
    assert [a["name"] for a in agents["details"]] == agents["agents"]
    assert Lambda.handler(http_v2("DELETE", "/api/v1/chat"))["statusCode"] == 404


@pytest.mark.parametrize(
    ("event", "status", "error"),
    [
        (http_v2("POST", "/api/v1/chat", "not json"), 400, "INVALID_JSON"),
        (http_v2("POST", "/api/v1/chat", "[1]"), 400, "INVALID_JSON"),
        (http_v2("POST", "/api/v1/chat", {"prompt": "x"}), 422, "INVALID_REQUEST"),
        (http_v2("POST", "/api/v1/chat", chat("s", "x", "nope")), 404, "AGENT_NOT_FOUND"),
        (http_v2("POST", "/api/v1/chat", chat("s", "x" * 2_000_000)), 413, "BODY_TOO_LARGE"),
        (http_v2("POST", "/api/v1/chat", chat("s", "x" * 300_000)), 413, "MESSAGE_TOO_LARGE"),
        (
            {**http_v2("POST", "/api/v1/chat", "e30="), "isBase64Encoded": True, "body": "%%"},
            400,
            "BAD_EVENT",
        ),
        ({"hello": "world"}, 400, "BAD_EVENT"),
        (http_v2("GET", "/api/v1/chat/s"), 400, "INVALID_REQUEST"),
    ],
)
def test_bad_requests_get_json_errors_and_nothing_is_queued(
    d: Deployment, event: dict[str, Any], status: int, error: str
) -> None:
    response = Lambda.handler(event, LambdaContext())
    assert (response["statusCode"], body_of(response)["error"]) == (status, error)
    assert sqs_event(d.input, wait=0)["Records"] == []


def test_idempotent_retry_returns_the_same_turn(d: Deployment) -> None:
    headers = {"idempotency-key": "k-1", "prefer": "respond-async"}
    first = Lambda.handler(http_v2("POST", "/api/v1/chat", chat("i", "x"), headers=headers))
    d.run_turns()
    again = Lambda.handler(http_v2("POST", "/api/v1/chat", chat("i", "x"), headers=headers))
    assert again["statusCode"] == 200
    assert body_of(again)["request_id"] == body_of(first)["request_id"]
    assert json.loads(body_of(again)["result"]) == ["x"]
    reused = Lambda.handler(http_v2("POST", "/api/v1/chat", chat("i", "y"), headers=headers))
    assert (reused["statusCode"], body_of(reused)["error"]) == (422, "IDEMPOTENCY_KEY_REUSED")
    assert sqs_event(d.input, wait=0)["Records"] == []


def test_an_unreachable_store_is_a_json_503_and_a_queued_turn_says_where_to_poll(
    d: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AK_EXECUTION__RESPONSE_STORE__DYNAMODB__ENDPOINT_URL", "http://127.0.0.1:9")
    Lambda.reset()
    got = Lambda.handler(http_v2("GET", "/api/v1/chat/s", query={"request_id": "r" * 32}))
    assert (got["statusCode"], body_of(got)["error"]) == (503, "STORE_UNAVAILABLE")
    assert got["headers"]["Retry-After"] == "1"
    posted = Lambda.handler(http_v2("POST", "/api/v1/chat", chat("down", "x")), LambdaContext())
    assert (posted["statusCode"], body_of(posted)["error"]) == (503, "STORE_UNAVAILABLE")
    request_id = body_of(posted)["request_id"]
    assert posted["headers"]["Location"] == f"/api/v1/chat/down?request_id={request_id}"
    [record] = sqs_event(d.input)["Records"]  # the turn is queued and will run
    assert json.loads(record["body"])["prompt"] == "x"


# -- the agent runner function --------------------------------------------------------------------


def enqueue(session: str, prompt: str, agent: str = "remember") -> str:
    event = http_v2(
        "POST", "/api/v1/chat", chat(session, prompt, agent), headers={"prefer": "respond-async"}
    )
    return str(body_of(Lambda.handler(event))["request_id"])


def test_partial_batch_failure_lists_the_failed_session_and_its_followers(d: Deployment) -> None:
    enqueue("ok", "1")
    bad = [enqueue("bad", "1", "flaky"), enqueue("bad", "2")]
    enqueue("ok", "2")
    event = sqs_event(d.input)
    by_id = {r["messageId"]: json.loads(r["body"])["prompt"] for r in event["Records"]}
    assert len(event["Records"]) == 4
    result = ServerlessAgentRunner.handle(event, LambdaContext())
    failed = [by_id[f["itemIdentifier"]] for f in result["batchItemFailures"]]
    assert failed == ["1", "2"], "the failed session's later record must be retried with it"
    replies = sqs_event(d.output)["Records"]
    assert {json.loads(r["body"])["result"] for r in replies} == {'["1"]', '["1", "2"]'}
    assert bad  # both ids were queued


def test_the_last_attempt_answers_with_an_error_instead_of_a_retry(d: Deployment) -> None:
    request_id = enqueue("l", "x", "flaky")
    boto3.client("sqs").set_queue_attributes(
        QueueUrl=d.input, Attributes={"VisibilityTimeout": "0"}
    )
    for attempt in (1, 2):
        result = pump(d.input, ServerlessAgentRunner.handle)[0]
        assert len(result["batchItemFailures"]) == 1, f"attempt {attempt} should be retried"
    assert pump(d.input, ServerlessAgentRunner.handle)[0] == {"batchItemFailures": []}
    pump(d.output, ResponseHandler.handle)
    got = Lambda.handler(http_v2("GET", "/api/v1/chat/l", query={"request_id": request_id}))
    assert (got["statusCode"], body_of(got)["error"]) == (500, "TURN_FAILED")
    assert body_of(got)["message"].endswith("last error: RetryableError: rate limited")


def test_poison_and_malformed_records(d: Deployment) -> None:
    sqs = boto3.client("sqs")
    sqs.send_message(
        QueueUrl=d.input,
        MessageBody="not json",
        MessageGroupId="p",
        MessageDeduplicationId="p1",
        MessageAttributes={"request_id": {"DataType": "String", "StringValue": "poison-1"}},
    )
    event = sqs_event(d.input)
    event["Records"].append({"no": "fields"})
    assert ServerlessAgentRunner.handle(event, LambdaContext()) == {"batchItemFailures": []}
    [reply] = sqs_event(d.output)["Records"]
    assert json.loads(reply["body"])["error"] == "INVALID_REQUEST"


# -- WebSocket ----------------------------------------------------------------------------------


class Tokens(AuthValidator):
    def validate(self, token: str) -> ValidationResult:
        if token == "good":
            return ValidationResult(True, claims={"sub": "alice"})
        return ValidationResult(False, error_msg="unknown token")


def connection(d: Deployment, connection_id: str) -> dict[str, Any] | None:
    item = boto3.client("dynamodb").get_item(
        TableName=d.connections, Key={"connection_id": {"S": connection_id}}
    )
    return item.get("Item")


def test_connect_checks_the_token_and_disconnect_forgets(d: Deployment) -> None:
    handler = WebsocketConnectionHandler.set_auth_validator(Tokens()).handler
    assert handler(websocket("CONNECT", "c-bad", query={"token": "bad"}))["statusCode"] == 401
    assert handler(websocket("CONNECT", "c-none"))["statusCode"] == 401
    assert connection(d, "c-bad") is None and connection(d, "c-none") is None
    assert (
        handler(websocket("CONNECT", "c-ok", headers={"Authorization": "Bearer good"}))[
            "statusCode"
        ]
        == 200
    )
    assert connection(d, "c-ok")["user_id"] == {"S": "token:alice"}  # type: ignore[index]
    assert handler(websocket("DISCONNECT", "c-ok"))["statusCode"] == 200
    assert connection(d, "c-ok") is None


def connect(*connections: str) -> None:
    for connection_id in connections:
        WebsocketConnectionHandler.handler(websocket("CONNECT", connection_id))


def test_a_websocket_turn_and_a_streamed_turn_reach_the_connection_in_order(d: Deployment) -> None:
    connect("conn-1", "conn-2")
    queued = Lambda.handler(
        websocket("MESSAGE", "conn-1", {"route": "chat", "body": chat("w", "hi")})
    )
    frame = body_of(queued)
    assert (frame["type"], frame["session_id"]) == ("CHAT_QUEUED", "w")
    d.run_turns()
    [response] = d.management.wait_for("conn-1", 1)
    assert (response["type"], response["status_code"]) == ("CHAT_RESPONSE", 200)
    assert json.loads(response["result"]) == ["hi"]

    streamed = {"route": "chat", "body": chat("w2", "a b c", "words") | {"stream": True}}
    Lambda.handler(websocket("MESSAGE", "conn-2", streamed))
    pump(d.input, ServerlessAgentRunner.handle)
    pump(d.output, ResponseHandler.handle, rounds=3)
    frames = d.management.wait_for("conn-2", 4)
    assert [f.get("delta") for f in frames] == ["a ", "b ", "c ", None]
    assert frames[-1]["done"] is True and frames[-1]["result"] == "a b c "


def test_the_stream_runner_streams_every_turn(d: Deployment) -> None:
    connect("conn-3")
    Lambda.handler(websocket("MESSAGE", "conn-3", chat("w3", "x y", "words")))
    d.run_turns(ServerlessStreamAgentRunner.handle)
    pump(d.output, ResponseHandler.handle, rounds=2)
    frames = d.management.wait_for("conn-3", 3)
    assert [f["type"] for f in frames] == ["STREAM_CHUNK"] * 3 and frames[-1]["done"] is True


def test_bad_websocket_frames_get_a_system_response(d: Deployment) -> None:
    connect("conn-x")
    for body, error in (
        ("nope", "INVALID_JSON"),
        ({"route": "admin"}, "UNKNOWN_ROUTE"),
        ({"body": {"prompt": "no session"}}, "INVALID_REQUEST"),
        ({"request_id": "x", "body": chat("s", "p")}, "INVALID_REQUEST_ID"),
    ):
        frame = body_of(Lambda.handler(websocket("MESSAGE", "conn-x", body)))
        assert (frame["type"], frame["error"]) == ("SYSTEM_RESPONSE", error)
        if error == "INVALID_REQUEST":  # the field named, as HTTP's details do
            assert frame["details"][0]["field"] == "session_id"
            assert "session_id" in frame["message"]
    assert sqs_event(d.input, wait=0)["Records"] == []


def test_a_gone_connection_is_forgotten_and_not_retried(d: Deployment) -> None:
    WebsocketConnectionHandler.handler(websocket("CONNECT", "gone-1"))
    d.management.gone.add("gone-1")
    Lambda.handler(websocket("MESSAGE", "gone-1", chat("g", "hi")))
    pump(d.input, ServerlessAgentRunner.handle)
    [result] = pump(d.output, ResponseHandler.handle)
    assert result == {"batchItemFailures": []}
    assert connection(d, "gone-1") is None
    assert sqs_event(d.output, wait=0)["Records"] == []


# -- store outages ---------------------------------------------------------------------------------


@pytest.fixture
def session_redis(d: Deployment, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The runner function keeps its sessions in a Redis of this test alone, which it can kill."""
    from tests.api.test_outages import PrivateRedis

    server = PrivateRedis()
    monkeypatch.setenv("AK_SESSION__TYPE", "redis")
    monkeypatch.setenv("AK_SESSION__REDIS__URL", server.url)
    ServerlessAgentRunner.reset()
    yield server
    server.kill()


@pytest.mark.redis
def test_a_store_outage_is_waited_out_in_the_invocation(d: Deployment, session_redis: Any) -> None:
    """A few seconds of session store outage cost no delivery (it used to spend one per try)."""
    request_id = enqueue("o", "x")
    event = sqs_event(d.input)
    session_redis.kill()
    threading.Timer(2.0, session_redis.start).start()
    started = time.monotonic()
    result = ServerlessAgentRunner.handle(event, LambdaContext(30))
    assert result == {"batchItemFailures": []}
    assert time.monotonic() - started >= 1.5  # it waited for Redis, not for a retry
    pump(d.output, ResponseHandler.handle)
    got = Lambda.handler(http_v2("GET", "/api/v1/chat/o", query={"request_id": request_id}))
    assert (got["statusCode"], body_of(got)["result"]) == (200, '["x"]')


@pytest.mark.redis
def test_a_store_outage_longer_than_the_invocation_reports_the_record(
    d: Deployment, session_redis: Any
) -> None:
    """With 6 s left (5 s kept to return), it waits about 1 s and hands the record back."""
    enqueue("o", "x")
    event = sqs_event(d.input)
    session_redis.kill()
    started = time.monotonic()
    result = ServerlessAgentRunner.handle(event, LambdaContext(6))
    waited = time.monotonic() - started
    assert [f["itemIdentifier"] for f in result["batchItemFailures"]] == [
        r["messageId"] for r in event["Records"]
    ]
    assert 0.8 <= waited < 4


def test_the_connection_store_without_a_region_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It used to raise botocore's NoRegionError, a client exception out of the backend."""
    from agentkernel.aws.websocket import ConnectionStore
    from agentkernel.core.errors import AKConfigError

    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    with pytest.raises(AKConfigError, match=r"api\.websocket\.connections_table") as caught:
        ConnectionStore("connections")
    assert caught.value.__cause__ is not None


# -- per-identity quota: a reply pushed to its WebSocket has been read ---------------------------


def test_websocket_replies_pushed_to_their_connection_free_the_unread_quota(
    d: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in issue 24: the Lambda response handler pushed WebSocket replies without telling
    the quota ledger, so every WebSocket turn counted as unread until the TTL: an identity was
    refused 429 after ``identity_unread_turns`` turns whose replies it had all received."""
    monkeypatch.setenv("AK_API__LIMITS__IDENTITY_UNREAD_TURNS", "2")
    event = websocket("CONNECT", "conn-q")
    event["requestContext"]["authorizer"] = {"principalId": "quinn"}
    WebsocketConnectionHandler.handler(event)
    for index in range(4):
        message = websocket("MESSAGE", "conn-q", {"route": "chat", "body": chat("q", f"t{index}")})
        message["requestContext"]["authorizer"] = {"principalId": "quinn"}
        queued = body_of(Lambda.handler(message))
        assert queued["type"] == "CHAT_QUEUED", queued
        d.run_turns()
        [response] = d.management.wait_for("conn-q", index + 1)[index:]
        assert response["type"] == "CHAT_RESPONSE"
