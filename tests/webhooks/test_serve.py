"""Webhooks end to end: through ``serve`` (embedded), through split mode's response handler on a
broker (Redis), and refused at the fronts (HTTP and WebSocket) when they may not be called."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client

from agentkernel.core.config.queues import RedisQueueConfig
from agentkernel.core.config.webhooks import WebhooksConfig
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.redis import RedisStreamsTransport
from agentkernel.pipeline.transport.sqs import MAX_ATTRIBUTES, encode_attributes
from agentkernel.pipeline.wire.chat import ChatRequest, fingerprint, turn_message
from agentkernel.pipeline.wire.envelope import (
    ATTR_CLIENT_REQUEST_ID,
    ATTR_CONNECTION_ID,
    ATTR_ENDPOINT,
    ATTR_STREAM,
    ATTR_TRACEPARENT,
    ATTR_USER_ID,
    ATTR_WEBHOOK,
)
from agentkernel.pipeline.wire.replies import ChatTurnBody, reply_message
from agentkernel.webhooks import ATTEMPT_HEADER, ID_HEADER, SIGNATURE_HEADER, verify_signature
from tests.api.conftest import Server, make_config, registry
from tests.transports.test_redis_streams import drop_keys
from tests.webhooks.receiver import Receiver

SECRET = "serve-secret"
CHAT = "/api/v1/chat"


def dev(**extra: Any) -> WebhooksConfig:
    settings: dict[str, Any] = {
        "secret": SECRET,
        "allowed_hosts": ["127.0.0.1"],
        "allow_http_loopback": True,
        "retry_delay": 0.2,
        "max_delivery_seconds": 5.0,
        "connect_timeout": 1.0,
        "read_timeout": 2.0,
    }
    return WebhooksConfig(**(settings | extra))


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    METRICS.reset()
    servers: list[Server] = []

    def start(
        webhooks: WebhooksConfig,
        transport: QueueTransport | None = None,
        turn_timeout: float | None = None,
    ) -> Server:
        config = make_config(webhooks=webhooks)
        execution = config.execution
        runner = execution.runner.model_copy(update={"turn_timeout": turn_timeout})
        execution = execution.model_copy(update={"runner": runner})
        config = config.model_copy(update={"execution": execution})
        handler = IOHandler(config, registry(), transport=transport, with_runner=True)
        servers.append(Server(handler))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def receivers() -> Iterator[Callable[[list[int]], Receiver]]:
    made: list[Receiver] = []

    def start(statuses: list[int]) -> Receiver:
        made.append(Receiver(statuses))
        return made[-1]

    yield start
    for receiver in made:
        receiver.close()


def metric(server: Server, outcome: str) -> str:
    lines = server.client.get("/metrics").text.splitlines()
    prefix = f'agentkernel_webhook_deliveries_total{{outcome="{outcome}"}} '
    return next((line.removeprefix(prefix) for line in lines if line.startswith(prefix)), "0")


# -- delivered ------------------------------------------------------------------------------------


def test_serve_posts_the_reply_signed_and_retries_after_a_500(
    serve: Callable[..., Server], receivers: Callable[[list[int]], Receiver]
) -> None:
    receiver = receivers([500, 200])
    server = serve(dev())
    body = {"session_id": "w1", "prompt": "hi", "agent": "echo", "webhook": receiver.url}
    reply = server.client.post(CHAT, json=body)
    assert reply.status_code == 200, reply.text
    first, second = receiver.wait(2)
    for post in (first, second):
        verify_signature(post.body, post.headers[SIGNATURE_HEADER], SECRET)
        assert post.path == "/hook?tenant=t1"
    assert (first.headers[ATTEMPT_HEADER], second.headers[ATTEMPT_HEADER]) == ("1", "2")
    assert first.headers[ID_HEADER] == second.headers[ID_HEADER]
    assert 0.1 <= second.at - first.at < 2.0  # retry_delay 0.2 s, jittered to 0.1-0.2 s
    doc = json.loads(second.body)
    assert doc["type"] == "turn.finished" and doc["status_code"] == 200
    assert doc["request_id"] == reply.json()["request_id"] and doc["session_id"] == "w1"
    assert doc["body"] == reply.json()
    time.sleep(0.5)
    assert len(receiver.received) == 2
    assert (metric(server, "retried"), metric(server, "delivered")) == ("1", "1")


def test_a_4xx_answer_is_not_retried(
    serve: Callable[..., Server], receivers: Callable[[list[int]], Receiver]
) -> None:
    receiver = receivers([404, 200])
    server = serve(dev())
    body = {"session_id": "w2", "prompt": "hi", "webhook": receiver.url}
    assert server.client.post(CHAT, json=body).status_code == 200
    receiver.wait(1)
    time.sleep(0.6)  # a retry would have come after 0.1-0.2 s
    assert len(receiver.received) == 1
    assert (metric(server, "failed"), metric(server, "retried")) == ("1", "0")


@pytest.mark.parametrize(
    ("agent", "status", "error"),
    [("broken", 500, "AGENT_ERROR"), ("flaky", 500, "TURN_FAILED"), ("slow", 504, "TURN_TIMEOUT")],
)
def test_every_outcome_is_posted(
    serve: Callable[..., Server],
    receivers: Callable[[list[int]], Receiver],
    agent: str,
    status: int,
    error: str,
) -> None:
    """An agent's error, a turn abandoned after its deliveries, a turn past its deadline."""
    receiver = receivers([200])
    server = serve(dev(), turn_timeout=0.3)
    body = {"session_id": f"w-{agent}", "prompt": "hi", "agent": agent, "webhook": receiver.url}
    body["seconds"] = 5  # the slow agent's sleep
    headers = {"Prefer": "respond-async"}
    assert server.client.post(CHAT, json=body, headers=headers).status_code == 202
    (post,) = receiver.wait(1, timeout=10)
    doc = json.loads(post.body)
    assert (doc["status_code"], doc["body"]["error"]) == (status, error)


def test_a_streamed_turn_posts_its_final_reply_once_and_no_chunk(
    serve: Callable[..., Server], receivers: Callable[[list[int]], Receiver]
) -> None:
    receiver = receivers([200])
    server = serve(dev())
    body = {"session_id": "w-st", "prompt": "a b c d", "agent": "words", "stream": True}
    body["webhook"] = receiver.url
    with server.client.stream("POST", CHAT, json=body, headers={"Accept": "text/event-stream"}):
        pass
    (post,) = receiver.wait(1)
    assert json.loads(post.body)["body"]["result"] == "a b c d "
    time.sleep(0.4)
    assert len(receiver.received) == 1


# -- split mode: the response handler on a broker ---------------------------------------------


@pytest.mark.redis
def test_split_mode_response_handler_posts_from_its_consumer_threads(
    serve: Callable[..., Server], receivers: Callable[[list[int]], Receiver], redis_url: str
) -> None:
    """Queues on Redis: the runner and the response handler consume on threads, as an IO
    process and a runner process do; the URL crosses the broker in the INPUT body and on the
    reply's attributes."""
    prefix = f"wh:{uuid.uuid4().hex[:10]}:"
    settings = RedisQueueConfig(url=redis_url, prefix=prefix, auto_provision=True)
    receiver = receivers([503, 200])
    try:
        server = serve(dev(), transport=RedisStreamsTransport(settings))
        body = {"session_id": "split", "prompt": "over redis", "webhook": receiver.url}
        reply = server.client.post(CHAT, json=body)
        assert reply.status_code == 200, reply.text
        first, second = receiver.wait(2)
        verify_signature(second.body, second.headers[SIGNATURE_HEADER], SECRET)
        assert json.loads(second.body)["body"] == reply.json()
        assert first.headers[ID_HEADER] == second.headers[ID_HEADER]
    finally:
        drop_keys(redis_url, prefix)


def test_the_reply_spends_one_attribute_and_fits_sqs() -> None:
    """The fullest reply (a Lambda WebSocket turn of an identity, streamed) with a webhook
    stays within SQS's 10 attributes; its INPUT message carries no webhook attribute."""
    chat = ChatRequest(session_id="s", prompt="p", webhook="https://hooks.example.com/x")
    attributes = {
        ATTR_USER_ID: "key:alice",
        ATTR_TRACEPARENT: "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        ATTR_CONNECTION_ID: "c1",
        ATTR_ENDPOINT: "https://api.example.com/prod",
        ATTR_STREAM: "1",
        ATTR_CLIENT_REQUEST_ID: "client-1",
    }
    turn = turn_message(chat, "r1", attributes)
    assert ATTR_WEBHOOK not in turn.attributes
    reply = reply_message(turn, "s", "r1", 200, "{}")
    assert reply.attributes[ATTR_WEBHOOK] == "https://hooks.example.com/x"
    assert len(reply.attributes) <= MAX_ATTRIBUTES
    encode_attributes(reply.attributes)  # raises past the limit
    without = turn_message(ChatRequest(session_id="s", prompt='say "webhook"'), "r2", {})
    assert ATTR_WEBHOOK not in reply_message(without, "s", "r2", 200, "{}").attributes


# -- refused at the front ---------------------------------------------------------------------

STRICT_HOSTS = [
    "*.example.com",
    "127.0.0.1",
    "10.0.0.1",
    "192.168.0.1",
    "169.254.169.254",
    "224.0.0.1",
    "240.0.0.1",
    "0.0.0.0",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[fe80::1]",
    "[fd00::1]",
    "[::]",
    "localhost",
]
REFUSED = [
    ("https://127.0.0.1/h", "address_not_allowed"),
    ("https://10.0.0.1/h", "address_not_allowed"),
    ("https://192.168.0.1/h", "address_not_allowed"),
    ("https://169.254.169.254/latest/meta-data/", "address_not_allowed"),
    ("https://224.0.0.1/h", "address_not_allowed"),
    ("https://240.0.0.1/h", "address_not_allowed"),
    ("https://0.0.0.0/h", "address_not_allowed"),
    ("https://[::1]/h", "address_not_allowed"),
    ("https://[::ffff:127.0.0.1]/h", "address_not_allowed"),
    ("https://[fe80::1]/h", "address_not_allowed"),
    ("https://[fd00::1]/h", "address_not_allowed"),
    ("https://[::]/h", "address_not_allowed"),
    ("https://localhost/h", "address_not_allowed"),
    ("http://127.0.0.1/h", "scheme"),
    ("ftp://hooks.example.com/h", "scheme"),
    ("https://user:pass@hooks.example.com/h", "credentials"),
    ("https://hooks.example.com/" + "x" * 3000, "too_long"),
    ("https://hooks.example.org/h", "host_not_allowed"),
    ("https://8.8.8.8/h", "host_not_allowed"),
    ("https://hooks.example.com/\u00e9", "malformed"),
]


def test_refused_webhooks_get_400_at_the_front_and_queue_nothing(
    serve: Callable[..., Server],
) -> None:
    server = serve(WebhooksConfig(secret=SECRET, allowed_hosts=STRICT_HOSTS))
    for url, reason in REFUSED:
        answer = server.client.post(CHAT, json={"session_id": "r", "prompt": "p", "webhook": url})
        assert answer.status_code == 400, (url, answer.text)
        doc = answer.json()
        assert (doc["error"], doc["reason"]) == ("INVALID_WEBHOOK", reason), (url, doc)
        assert "request_id" not in doc and "Location" not in answer.headers
    assert server.handler.transport.depth("input") == 0  # type: ignore[attr-defined]
    assert metric(server, "failed") == "0"


def test_hostile_webhook_values(serve: Callable[..., Server]) -> None:
    server = serve(WebhooksConfig(secret=SECRET, allowed_hosts=["*"]))
    huge = "https://hooks.example.com/" + "a" * 500_000
    answer = server.client.post(CHAT, json={"session_id": "h", "prompt": "p", "webhook": huge})
    assert answer.status_code == 400 and answer.json()["reason"] == "too_long"
    for value in (42, ["https://x.example.com"], {"url": "x"}, True):
        body = {"session_id": "h", "prompt": "p", "webhook": value}
        answer = server.client.post(CHAT, json=body)
        assert answer.status_code == 422, (value, answer.text)
        assert answer.json()["details"][0]["field"] == "webhook"
    body = {"session_id": "h", "prompt": "p", "webhook": ""}
    assert server.client.post(CHAT, json=body).json()["error"] == "INVALID_WEBHOOK"


def test_without_a_secret_a_webhook_is_refused(serve: Callable[..., Server]) -> None:
    server = serve(WebhooksConfig(allowed_hosts=["*"]))
    body = {"session_id": "n", "prompt": "p", "webhook": "https://hooks.example.com/h"}
    answer = server.client.post(CHAT, json=body)
    assert answer.status_code == 400 and answer.json()["error"] == "WEBHOOKS_DISABLED"
    plain = server.client.post(CHAT, json={"session_id": "n", "prompt": "p"})
    assert plain.status_code == 200  # a turn without one is untouched


def test_the_websocket_front_refuses_alike(serve: Callable[..., Server]) -> None:
    server = serve(WebhooksConfig(secret=SECRET, allowed_hosts=["*"]))
    url = server.url.replace("http://", "ws://") + "/ws"
    frame = {"session_id": "ws", "prompt": "p", "webhook": "https://169.254.169.254/"}
    with ws_client.connect(url) as ws:
        ws.send(json.dumps({"route": "chat", "request_id": "client-01", "body": frame}))
        answer = json.loads(ws.recv(timeout=10))
    assert answer["type"] == "SYSTEM_RESPONSE" and answer["error"] == "INVALID_WEBHOOK"
    assert "link-local" in answer["message"]


def test_openapi_documents_the_field(serve: Callable[..., Server]) -> None:
    server = serve(WebhooksConfig())
    spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
    schema = spec["paths"][CHAT]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "webhook" in json.dumps(schema)
    assert "INVALID_WEBHOOK" in spec["paths"][CHAT]["post"]["responses"]["400"]["description"]


def test_turns_an_embedded_server_abandons_at_shutdown_are_posted(
    receivers: Callable[[list[int]], Receiver],
) -> None:
    """The running turn cut short and the one still queued behind it: both answered 503
    SHUTTING_DOWN, and both webhooks sent while the process stops."""
    METRICS.reset()
    receiver = receivers([200])
    config = make_config(webhooks=dev())
    runner = config.execution.runner.model_copy(update={"drain_timeout": 0.3})
    config = config.model_copy(
        update={"execution": config.execution.model_copy(update={"runner": runner})}
    )
    server = Server(IOHandler(config, registry(), with_runner=True))
    try:
        async_ = {"Prefer": "respond-async"}
        slow = {"session_id": "bye", "prompt": "p", "agent": "slow", "seconds": 5}
        for body in (slow, {"session_id": "bye", "prompt": "q", "agent": "echo"}):
            answer = server.client.post(CHAT, json=body | {"webhook": receiver.url}, headers=async_)
            assert answer.status_code == 202
        time.sleep(0.3)  # the slow turn is running, the other waits behind it
    finally:
        server.close()
    posts = receiver.wait(2, timeout=5)
    docs = [json.loads(post.body) for post in posts]
    assert [(d["status_code"], d["body"]["error"]) for d in docs] == [(503, "SHUTTING_DOWN")] * 2


def test_the_agent_does_not_see_the_webhook_and_old_fingerprints_hold() -> None:
    chat = ChatRequest(session_id="s", prompt="p", webhook="https://hooks.example.com/x")
    body = ChatTurnBody.model_validate_json(turn_message(chat, "r", {}).body)
    assert body.webhook == "https://hooks.example.com/x" and body.model_extra == {}
    plain = ChatRequest(session_id="s", prompt="p")
    before = {"agent": None, "prompt": "p", "session_id": "s"}  # what was hashed until now
    text = json.dumps(before, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert fingerprint(plain) == hashlib.sha256(text.encode()).hexdigest()
    assert fingerprint(chat) != fingerprint(plain)


def test_an_idempotent_retry_must_name_the_same_webhook(serve: Callable[..., Server]) -> None:
    server = serve(dev())
    headers = {"Idempotency-Key": "k-1", "Prefer": "respond-async"}
    first = {"session_id": "idem", "prompt": "p"}
    assert server.client.post(CHAT, json=first, headers=headers).status_code == 202
    again = first | {"webhook": "http://127.0.0.1:9/other"}
    answer = server.client.post(CHAT, json=again, headers=headers)
    assert (answer.status_code, answer.json()["error"]) == (422, "IDEMPOTENCY_KEY_REUSED")
