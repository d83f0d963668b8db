"""Per-identity caps on unread turns and stored reply bytes (issue 24): real uvicorn, real HTTP
and WebSocket clients, with the in-memory store, and with Redis or DynamoDB (moto) shared by two
IO processes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client

from agentkernel.core.config.auth import AuthConfig
from agentkernel.core.config.limits import LimitsConfig
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.api.conftest import Server, poll, start_server  # noqa: F401 - fixture

KEYS = {"alice": "alice-key-quota-1", "bob": "bob-key-quota-2"}
AUTH = AuthConfig.model_validate(
    {"enabled": True, "api_keys": [{"user": u, "key": k} for u, k in KEYS.items()]}
)
ASYNC = {"Prefer": "respond-async"}


def dynamodb_table(request: pytest.FixtureRequest) -> str:
    request.getfixturevalue("aws")
    from tests.stores.test_response_stores import create_table

    table = f"akq-{uuid.uuid4().hex[:8]}"
    create_table(table, "request_id")
    return table


def shared_stores(request: pytest.FixtureRequest, kind: str) -> Callable[[], ResponseStore]:
    """Makes stores of one shared deployment: each its own client, like one per IO process."""
    if kind == "redis":
        url, prefix = request.getfixturevalue("redis_url"), f"akq-{uuid.uuid4().hex[:8]}:"
        from agentkernel.pipeline.response_store.redis import RedisResponseStore

        return lambda: RedisResponseStore(url, prefix=prefix)
    from agentkernel.pipeline.response_store.dynamodb import DynamoDBResponseStore

    table = dynamodb_table(request)
    return lambda: DynamoDBResponseStore(table)


@pytest.fixture(params=["in_memory", "redis", "dynamodb"])
def store(request: pytest.FixtureRequest) -> ResponseStore:
    if request.param == "in_memory":
        return InMemoryResponseStore()
    return shared_stores(request, request.param)()


def post(
    server: Server, user: str, session: str, prompt: str = "hi", agent: str = "echo", **headers: str
) -> Any:
    body = {"session_id": session, "prompt": prompt, "agent": agent, "seconds": 3}
    return server.client.post(
        "/api/v1/chat", json=body, headers={"X-API-Key": KEYS[user], **headers}
    )


def read(server: Server, user: str, session: str, request_id: str) -> httpx.Response:
    server.client.headers["X-API-Key"] = KEYS[user]
    try:
        return poll(server.client, session, request_id)
    finally:
        del server.client.headers["X-API-Key"]


def capped(start: Callable[..., Server], store: ResponseStore, **limits: Any) -> Server:
    transport = InMemoryTransport()
    return start(transport=transport, store=store, auth=AUTH, limits=LimitsConfig(**limits))


def test_unread_async_turns_are_capped_per_identity_and_freed_by_reading(
    start_server: Any,  # noqa: F811
    store: ResponseStore,
) -> None:
    server = capped(start_server, store, identity_unread_turns=3)
    accepted = [post(server, "alice", f"a{i}", **ASYNC) for i in range(3)]
    assert [r.status_code for r in accepted] == [202, 202, 202]
    refused = post(server, "alice", "a3", **ASYNC)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"] == "QUOTA_EXCEEDED"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert post(server, "bob", "b0", **ASYNC).status_code == 202  # another identity is not held
    first = accepted[0].json()
    assert read(server, "alice", first["session_id"], first["request_id"]).status_code == 200
    assert post(server, "alice", "a4", **ASYNC).status_code == 202  # reading freed a place


def test_an_idempotent_retry_of_a_counted_turn_is_not_refused(
    start_server: Any,  # noqa: F811
    store: ResponseStore,
) -> None:
    server = capped(start_server, store, identity_unread_turns=1)
    key = {"Idempotency-Key": "same"}
    first = post(server, "alice", "k", agent="slow", **ASYNC, **key)  # its reply takes 3 s
    again = post(server, "alice", "k", agent="slow", **ASYNC, **key)
    assert (first.status_code, again.status_code) == (202, 202)
    assert post(server, "alice", "k2", **ASYNC).status_code == 429


def test_sync_and_websocket_answers_count_as_read(start_server: Any) -> None:  # noqa: F811
    server = capped(start_server, InMemoryResponseStore(), identity_unread_turns=2)
    for i in range(4):  # sync: each answer hands the reply over
        assert post(server, "alice", f"s{i}").status_code == 200
    url = server.url.replace("http://", "ws://") + "/ws"
    with ws_client.connect(url, additional_headers={"X-API-Key": KEYS["alice"]}) as ws:
        for i in range(4):
            ws.send(json.dumps({"session_id": f"w{i}", "prompt": "hi", "agent": "echo"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "CHAT_QUEUED"
            assert json.loads(ws.recv(timeout=10))["type"] == "CHAT_RESPONSE"


def test_stored_reply_bytes_are_capped_per_identity(
    start_server: Any,  # noqa: F811
    store: ResponseStore,
) -> None:
    server = capped(start_server, store, identity_unread_turns=None, identity_reply_bytes=50_000)
    answered = post(server, "alice", "big", prompt="x" * 30_000)
    assert answered.status_code == 200
    assert post(server, "alice", "big2", prompt="x" * 30_000).status_code == 200
    refused = post(server, "alice", "big3", prompt="small", **ASYNC)
    assert refused.status_code == 429 and "Retry-After" in refused.headers
    assert post(server, "bob", "b", prompt="small").status_code == 200


class CountingTransport(InMemoryTransport):
    """The in-memory broker, counting what the front put on INPUT."""

    sent = 0

    def send(self, queue: QueueName, message: QueueMessage) -> None:
        if queue is QueueName.INPUT:
            self.sent += 1
        super().send(queue, message)


def test_a_refused_turn_is_never_queued(start_server: Any) -> None:  # noqa: F811
    transport = CountingTransport()
    server = start_server(
        transport=transport,
        store=InMemoryResponseStore(),
        auth=AUTH,
        limits=LimitsConfig(identity_unread_turns=1),
        mode="rest_async",
    )
    assert post(server, "alice", "q0").status_code == 202
    assert post(server, "alice", "q1").status_code == 429
    assert transport.sent == 1


@pytest.mark.parametrize("kind", ["redis", "dynamodb"])
def test_two_io_processes_sharing_a_store_share_the_count(
    start_server: Any,  # noqa: F811
    request: pytest.FixtureRequest,
    kind: str,
) -> None:
    make_store = shared_stores(request, kind)
    servers = [
        start_server(
            transport=InMemoryTransport(),
            store=make_store(),
            auth=AUTH,
            limits=LimitsConfig(identity_unread_turns=2),
        )
        for _ in range(2)
    ]
    assert post(servers[0], "alice", "r0", **ASYNC).status_code == 202
    assert post(servers[1], "alice", "r1", **ASYNC).status_code == 202
    assert post(servers[0], "alice", "r2", **ASYNC).status_code == 429
    assert post(servers[1], "alice", "r3", **ASYNC).status_code == 429


def test_without_authentication_no_identity_is_capped(start_server: Any) -> None:  # noqa: F811
    server = start_server(
        store=InMemoryResponseStore(), limits=LimitsConfig(identity_unread_turns=1)
    )
    body = {"session_id": "anon", "prompt": "hi", "agent": "echo"}
    codes = [
        server.client.post("/api/v1/chat", json=body, headers=ASYNC).status_code for _ in range(3)
    ]
    assert codes == [202, 202, 202]
