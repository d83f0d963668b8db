"""Identities and sessions, the same rules proved on every front.

One suite of ownership tests runs against four fronts: the FastAPI REST routes and ``/ws`` on a
real uvicorn server (with the in-memory and with the Redis response store), and the Lambda
request handler's HTTP and WebSocket routes on moto's SQS and DynamoDB. Every front runs with
its production defaults: authentication on, and no ``api.idempotency_secret``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed

from agentkernel import Agent, AgentRegistry, Module
from agentkernel.aws import Lambda, ResponseHandler, ServerlessAgentRunner
from agentkernel.aws import WebsocketConnectionHandler as Connections
from agentkernel.core.config.auth import AuthConfig
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.response_store.redis import RedisResponseStore
from tests.api.conftest import Server, make_config, poll

KEYS = {"alice": "alice-key-5d1e", "bob": "bob-key-77af"}
OLD_NAMESPACE = uuid.UUID("6f1c3a4e-8f7d-4c1b-9a55-2f3e0b7c9d10")  # the public constant of old


def remember(turn):  # type: ignore[no-untyped-def]
    turn.state.setdefault("seen", []).append(turn.prompt)
    return json.dumps(turn.state["seen"])


class Front:
    """What a test does through a front: send a turn as someone and get its answer, read."""

    name = ""
    reads = True  # whether the front answers GET /api/v1/chat/{session}

    def turn(self, who: str, session: str, prompt: str, key: str | None = None) -> dict[str, Any]:
        """Send a turn as ``who`` and return its answer (reply document or error frame)."""
        raise NotImplementedError

    def read(self, who: str, session: str, request_id: str) -> tuple[int, Any]:
        raise NotImplementedError


class Rest(Front):
    name = "rest"

    def __init__(self, server: Server) -> None:
        self.server = server

    def turn(self, who: str, session: str, prompt: str, key: str | None = None) -> dict[str, Any]:
        headers = {"X-API-Key": KEYS[who]} | ({"Idempotency-Key": key} if key else {})
        body = {"session_id": session, "prompt": prompt}
        response = self.server.client.post("/api/v1/chat", json=body, headers=headers)
        doc: dict[str, Any] = response.json()
        return doc | {"status": response.status_code}

    def read(self, who: str, session: str, request_id: str) -> tuple[int, Any]:
        with httpx.Client(base_url=self.server.url, headers={"X-API-Key": KEYS[who]}) as client:
            response = poll(client, session, request_id, timeout=0.5)
        return response.status_code, response.json().get("error")


class RestQuery(Rest):
    """Reads with upstream's poll form, ``GET /api/v1/chat?request_id=&session_id=``."""

    name = "rest-query"

    def read(self, who: str, session: str, request_id: str) -> tuple[int, Any]:
        query = {"request_id": request_id, "session_id": session}
        with httpx.Client(base_url=self.server.url, headers={"X-API-Key": KEYS[who]}) as client:
            deadline = time.monotonic() + 0.5
            while True:
                response = client.get("/api/v1/chat", params=query)
                if response.status_code != 404 or time.monotonic() > deadline:
                    return response.status_code, response.json().get("error")
                time.sleep(0.02)


class Socket(Rest):
    name = "ws"

    def turn(self, who: str, session: str, prompt: str, key: str | None = None) -> dict[str, Any]:
        url = self.server.url.replace("http://", "ws://") + "/ws"
        frame = {"body": {"session_id": session, "prompt": prompt}} | (
            {"request_id": key} if key else {}
        )
        with ws_client.connect(url, additional_headers={"X-API-Key": KEYS[who]}) as ws:
            ws.send(json.dumps(frame))
            queued = json.loads(ws.recv(timeout=10))
            if queued["type"] != "CHAT_QUEUED":
                return dict(queued)
            answer: dict[str, Any] = json.loads(ws.recv(timeout=10))
        assert queued["request_id"] == answer["request_id"]
        return answer | {"status": answer.get("status_code", 500)}


class LambdaHttp(Front):
    name = "lambda-http"

    def __init__(self, deployment: Any) -> None:
        self.d = deployment

    def _event(self, who: str, method: str, path: str, **more: Any) -> dict[str, Any]:
        from tests.aws.lambda_harness import http_v2

        event = http_v2(method, path, **more)
        event["requestContext"]["authorizer"] = {"lambda": {}, "principalId": who}
        return event

    def turn(self, who: str, session: str, prompt: str, key: str | None = None) -> dict[str, Any]:
        headers = {"prefer": "respond-async"} | ({"idempotency-key": key} if key else {})
        body = {"session_id": session, "prompt": prompt}
        accepted = Lambda.handler(
            self._event(who, "POST", "/api/v1/chat", body=body, headers=headers)
        )
        doc = json.loads(accepted["body"])
        if accepted["statusCode"] != 202:
            return doc | {"status": accepted["statusCode"]}
        self.d.run_turns()
        query = {"request_id": doc["request_id"]}
        got = Lambda.handler(self._event(who, "GET", f"/api/v1/chat/{session}", query=query))
        return dict(json.loads(got["body"])) | {"status": got["statusCode"]}

    def read(self, who: str, session: str, request_id: str) -> tuple[int, Any]:
        query = {"request_id": request_id}
        got = Lambda.handler(self._event(who, "GET", f"/api/v1/chat/{session}", query=query))
        return got["statusCode"], json.loads(got["body"]).get("error")


class LambdaSocket(LambdaHttp):
    name = "lambda-ws"
    reads = False

    def turn(self, who: str, session: str, prompt: str, key: str | None = None) -> dict[str, Any]:
        from tests.aws.lambda_harness import websocket

        connection = f"{who}-{uuid.uuid4().hex[:8]}"
        connect = websocket("CONNECT", connection)
        connect["requestContext"]["authorizer"] = {"principalId": who}
        assert Connections.handler(connect)["statusCode"] == 200
        frame = {"body": {"session_id": session, "prompt": prompt}} | (
            {"request_id": key} if key else {}
        )
        message = websocket("MESSAGE", connection, frame)
        message["requestContext"]["authorizer"] = {"principalId": who}
        queued = json.loads(Lambda.handler(message)["body"])
        if queued["type"] != "CHAT_QUEUED":
            return dict(queued)
        self.d.run_turns()
        [answer] = self.d.management.wait_for(connection, 1)
        assert queued["request_id"] == answer["request_id"]
        return dict(answer) | {"status": answer.get("status_code", 500)}


def uvicorn_server(store: str, redis_url: str) -> Server:
    registry = AgentRegistry()
    registry.register(Agent("remember", remember))
    auth = AuthConfig(enabled=True, api_keys=[{"user": u, "key": k} for u, k in KEYS.items()])
    response_store = None
    if store == "redis":
        response_store = RedisResponseStore(redis_url, prefix=f"own-{uuid.uuid4().hex[:8]}:")
    config = make_config(auth=auth)
    handler = IOHandler(config, registry=registry, store=response_store, with_runner=True)
    return Server(handler)


def _fronts(*kinds: str) -> list[Any]:
    return [pytest.param(k, marks=pytest.mark.aws) if k.startswith("lambda") else k for k in kinds]


ALL_FRONTS = _fronts(
    "rest-memory", "ws-memory", "rest-redis", "ws-redis", "lambda-http", "lambda-ws"
)
#: The fronts that read replies back (a Lambda socket's answers reach only its own connection),
#: plus upstream's query form of the read on the FastAPI front.
READING_FRONTS = [f for f in ALL_FRONTS if getattr(f, "values", [f])[0] != "lambda-ws"] + [
    "restq-memory",
    "restq-redis",
]
#: The fronts that show derived request ids (a socket shows the client's own id).
ID_FRONTS = _fronts("rest-memory", "rest-redis", "lambda-http")


@pytest.fixture(params=ALL_FRONTS)
def front(request: pytest.FixtureRequest) -> Iterator[Front]:
    yield from _make_front(request, str(request.param))


@pytest.fixture(params=READING_FRONTS)
def reading_front(request: pytest.FixtureRequest) -> Iterator[Front]:
    yield from _make_front(request, str(request.param))


@pytest.fixture(params=ID_FRONTS)
def id_front(request: pytest.FixtureRequest) -> Iterator[Front]:
    yield from _make_front(request, str(request.param))


def _make_front(request: pytest.FixtureRequest, kind: str) -> Iterator[Front]:
    if kind.startswith("lambda"):
        yield from _lambda_front(request, kind)
        return
    name, store = kind.split("-")
    redis_url = request.getfixturevalue("redis_url") if store == "redis" else ""
    server = uvicorn_server(store, redis_url)
    try:
        yield {"rest": Rest, "restq": RestQuery, "ws": Socket}[name](server)
    finally:
        server.close()


def _lambda_front(request: pytest.FixtureRequest, kind: str) -> Iterator[Front]:
    from tests.aws.test_lambda import Deployment

    request.getfixturevalue("aws")
    monkeypatch = request.getfixturevalue("monkeypatch")
    for cls in (Lambda, ServerlessAgentRunner, ResponseHandler, Connections):
        cls.reset()
    AgentRegistry.reset()
    Module([Agent("remember", remember)])
    deployment = Deployment(monkeypatch)
    try:
        yield LambdaHttp(deployment) if kind == "lambda-http" else LambdaSocket(deployment)
    finally:
        deployment.management.close()
        for cls in (Lambda, ServerlessAgentRunner, ResponseHandler, Connections):
            cls.reset()
        AgentRegistry.reset()


def seen(answer: dict[str, Any]) -> list[str]:
    assert answer["status"] == 200, answer
    result: list[str] = json.loads(answer["result"])
    return result


def test_two_identities_naming_one_session_id_talk_in_two_sessions(front: Front) -> None:
    """Item 3: nobody can probe or squat another identity's session id."""
    session = f"s-{uuid.uuid4().hex[:6]}"
    assert seen(front.turn("bob", session, "squat")) == ["squat"]  # bob comes first
    assert seen(front.turn("alice", session, "one")) == ["one"]  # alice is not refused
    assert seen(front.turn("bob", session, "again")) == ["squat", "again"]
    assert seen(front.turn("alice", session, "two")) == ["one", "two"]


def test_another_identity_cannot_read_a_reply(reading_front: Front) -> None:
    """Items 1 and 9: every front that reads checks the owner."""
    front = reading_front
    assert front.reads
    session = f"r-{uuid.uuid4().hex[:6]}"
    answer = front.turn("alice", session, "secret")
    request_id = answer["request_id"]
    assert front.read("alice", session, request_id)[0] == 200
    assert front.read("bob", session, request_id) == (404, "NOT_FOUND")


def test_a_client_id_or_key_taken_first_by_another_identity_costs_nothing(front: Front) -> None:
    """Items 2 and 4: one identity's ids neither block nor reveal another's."""
    session, key = f"k-{uuid.uuid4().hex[:6]}", f"req-{uuid.uuid4().hex[:8]}"
    assert seen(front.turn("bob", session, "bob first", key)) == ["bob first"]
    mine = front.turn("alice", session, "mine", key)
    assert seen(mine) == ["mine"]  # not IDEMPOTENCY_KEY_REUSED, not bob's reply
    if isinstance(front, (Socket, LambdaSocket)):
        assert mine["request_id"] == key  # the client's id is echoed
    again = front.turn("alice", session, "mine", key)
    assert seen(again) == ["mine"]  # the same key is the same turn: not run twice


def test_derived_request_ids_cannot_be_computed_from_public_values(id_front: Front) -> None:
    """Item 2: without api.idempotency_secret an id is keyed by the deployment's own secret."""
    front = id_front
    session, key = f"i-{uuid.uuid4().hex[:6]}", "idem-key-1"
    request_id = front.turn("alice", session, "x", key)["request_id"]
    for user in ("alice", "key:alice", "lambda:alice"):
        guess = uuid.uuid5(OLD_NAMESPACE, f"{user}\n{session}\n{key}").hex
        assert request_id != guess


def test_a_socket_closes_when_its_credential_expires(redis_url: str) -> None:
    """Item 5: a JWT that expires closes the socket, with a SYSTEM frame and code 4401."""
    import jwt

    secret = "hs256-owner-test-secret-0123456789abcdef"
    registry = AgentRegistry()
    registry.register(Agent("remember", remember))
    auth = AuthConfig(enabled=True, jwt={"secret": secret})
    server = Server(IOHandler(make_config(auth=auth), registry=registry, with_runner=True))
    try:
        token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 2}, secret, "HS256")
        url = server.url.replace("http://", "ws://") + "/ws?token=" + token
        with ws_client.connect(url) as ws:
            ws.send(json.dumps({"session_id": "exp", "prompt": "in time"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "CHAT_QUEUED"
            assert json.loads(ws.recv(timeout=10))["type"] == "CHAT_RESPONSE"
            closing = json.loads(ws.recv(timeout=10))  # pushed at expiry, unasked
            assert (closing["type"], closing["error"]) == ("SYSTEM_RESPONSE", "CREDENTIAL_EXPIRED")
            with pytest.raises(ConnectionClosed):
                ws.send(json.dumps({"session_id": "exp", "prompt": "too late"}))
                ws.recv(timeout=5)
            assert ws.close_code == 4401
    finally:
        server.close()


def test_a_lambda_socket_is_refused_and_closed_once_its_credential_expired(
    aws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items 5 and 9 on Lambda: the connection record ends with the credential."""
    from agentkernel.auth import AuthValidator, ValidationResult
    from tests.aws.lambda_harness import websocket
    from tests.aws.test_lambda import Deployment

    class Expiring(AuthValidator):
        def validate(self, token: str) -> ValidationResult:
            return ValidationResult(True, claims={"sub": "alice", "exp": time.time() + 1})

    for cls in (Lambda, Connections):
        cls.reset()
    AgentRegistry.reset()
    Module([Agent("remember", remember)])
    d = Deployment(monkeypatch)
    try:
        handler = Connections.set_auth_validator(Expiring()).handler
        assert handler(websocket("CONNECT", "c-exp", query={"token": "t"}))["statusCode"] == 200
        body = {"body": {"session_id": "e", "prompt": "hi"}}
        first = json.loads(Lambda.handler(websocket("MESSAGE", "c-exp", body))["body"])
        assert first["type"] == "CHAT_QUEUED"
        time.sleep(1.2)
        late = json.loads(Lambda.handler(websocket("MESSAGE", "c-exp", body))["body"])
        assert (late["type"], late["error"]) == ("SYSTEM_RESPONSE", "CREDENTIAL_EXPIRED")
        assert d.management.closed == ["c-exp"]
    finally:
        d.management.close()
        for cls in (Lambda, Connections):
            cls.reset()
        AgentRegistry.reset()


def test_a_jwt_subject_is_not_the_api_key_user_of_the_same_name() -> None:
    """Item 6: schemes never share a namespace unless api.auth.aliases says so."""
    import jwt

    secret = "hs256-owner-test-secret-0123456789abcdef"
    registry = AgentRegistry()
    registry.register(Agent("remember", remember))
    keys = [{"user": u, "key": k} for u, k in KEYS.items()]
    plain = AuthConfig(enabled=True, api_keys=keys, jwt={"secret": secret})
    aliased = plain.model_copy(update={"aliases": {"jwt:alice": "key:alice"}})
    token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, secret, "HS256")
    for auth, expected in ((plain, ["by token"]), (aliased, ["by key", "by token"])):
        server = Server(IOHandler(make_config(auth=auth), registry=registry, with_runner=True))
        try:
            key = Rest(server).turn("alice", "shared", "by key")
            assert seen(key) == ["by key"]
            by_token = server.client.post(
                "/api/v1/chat",
                json={"session_id": "shared", "prompt": "by token"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert json.loads(by_token.json()["result"]) == expected
        finally:
            server.close()


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_another_identity_gets_no_byte_of_a_stream(store: str, redis_url: str) -> None:
    """Item 1: a stream resume (live, or with Last-Event-ID after the end) answers another
    identity 404 JSON before any byte of the stream."""
    server = uvicorn_server(store, redis_url)
    try:
        with server.client.stream(
            "POST",
            "/api/v1/chat",
            json={"session_id": "st", "prompt": "hidden words"},
            headers={"X-API-Key": KEYS["alice"], "Accept": "text/event-stream"},
        ) as streamed:
            request_id = streamed.headers["x-request-id"]
            text = "".join(streamed.iter_text())
        assert '"done": true' in text
        path = f"/api/v1/chat/st/stream?request_id={request_id}"
        for headers in ({}, {"Last-Event-ID": "0"}):
            theirs = server.client.get(path, headers={"X-API-Key": KEYS["bob"]} | headers)
            assert theirs.status_code == 404, theirs.text
            assert theirs.json()["error"] == "NOT_FOUND"
            assert "hidden" not in theirs.text
            mine = server.client.get(path, headers={"X-API-Key": KEYS["alice"]} | headers)
            assert mine.status_code == 200 and '"done": true' in mine.text
    finally:
        server.close()
