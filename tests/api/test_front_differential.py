"""The same request through the FastAPI app and through ``Lambda.handler`` gets the same answer.

Both adapters sit over one chat front (:mod:`agentkernel.pipeline.front.chat_front`); each case runs
twice, once per adapter, against a fresh in-memory transport and store prepared the same way, and
the status, error code, body and polling headers must match. Lambda events alternate between the
HTTP API (2.0) and REST API (1.0) shapes; the caller's identity is an API key on FastAPI and the
authorizer's ``principalId`` / JWT ``sub`` on Lambda, three identities (``key:alice``,
``lambda:alice``, ``jwt:alice``) that ``api.auth.aliases`` maps onto one, ``alice``, on purpose.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from agentkernel import Agent, AgentRegistry
from agentkernel.aws.request import Lambda
from agentkernel.core.config.auth import AuthConfig
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.http.request_handler import RequestHandler
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.chat import request_id_for
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket

KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-0123456789"}
FRESH_ID = re.compile(r"\b[0-9a-f]{32}\b")
HEADERS = ("location", "retry-after", "content-location", "preference-applied")
SECRET = "differential-test-secret"
ALIASES = {f"{scheme}:{user}": user for user in KEYS for scheme in ("key", "lambda", "jwt")}


@dataclass
class Case:
    """One request, the store as it should be before it, and who sends it."""

    name: str
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    identity: str | None = "alice"
    before: Callable[[InMemoryResponseStore], None] = lambda store: None
    first: Case | None = None  # sent first through the same adapter (an earlier POST)


def chat(session: str = "s1", prompt: str = "hi", **more: Any) -> bytes:
    return json.dumps({"session_id": session, "prompt": prompt, **more}).encode()


def reply(session: str, request_id: str, owner: str | None) -> Callable[[Any], None]:
    doc = {"result": "done", "session_id": session, "request_id": request_id, "agent": "echo"}
    return lambda store: store.put(ResponseRecord(request_id, session, 200, doc, owner))


def ticket(session: str, request_id: str, owner: str | None) -> Callable[[Any], None]:
    return lambda store: store.accept(TurnTicket(request_id, session, "f" * 64, owner))


KEYED = request_id_for("s 1%x", "key-1", "alice", SECRET)[
    0
]  # an id derived from an Idempotency-Key
ASYNC = {"prefer": "respond-async"}
CASES = [
    Case("async post", "POST", "/api/v1/chat", chat(), ASYNC),
    Case(
        "async post, other Prefer tokens",
        "POST",
        "/api/v1/chat",
        chat(),
        {"prefer": "wait=5, respond-async"},
    ),
    Case(
        "Prefer that only contains the word",
        "POST",
        "/api/v1/chat",
        chat(),
        {"prefer": "x-respond-async-not"} | {"idempotency-key": "k0"},
        before=reply("s1", request_id_for("s1", "k0", "alice", SECRET)[0], "alice"),
    ),
    Case(
        "keyed async post with a session to quote",
        "POST",
        "/api/v1/chat",
        chat("s%1"),
        ASYNC | {"idempotency-key": "k:1/2"},
    ),
    Case("malformed JSON", "POST", "/api/v1/chat", b"{nope"),
    Case("not an object", "POST", "/api/v1/chat", b"[1, 2]"),
    Case("invalid fields", "POST", "/api/v1/chat", chat(prompt="")),
    Case("session with a slash", "POST", "/api/v1/chat", chat("a/b")),
    Case("oversized body", "POST", "/api/v1/chat", chat(prompt="x" * 300_000)),
    Case("unknown agent", "POST", "/api/v1/chat", chat(agent="nobody")),
    Case("empty idempotency key", "POST", "/api/v1/chat", chat(), {"idempotency-key": ""}),
    Case("GET without request_id", "GET", "/api/v1/chat/s1"),
    Case("GET of an unknown id", "GET", "/api/v1/chat/s1", query={"request_id": "r" * 32}),
    Case(
        "GET of a pending turn",
        "GET",
        "/api/v1/chat/s1",
        query={"request_id": "p" * 32},
        before=ticket("s1", "p" * 32, "alice"),
    ),
    Case(
        "GET of another identity's pending turn",
        "GET",
        "/api/v1/chat/s1",
        query={"request_id": "p" * 32},
        identity="bob",
        before=ticket("s1", "p" * 32, "alice"),
    ),
    Case(
        "GET of a reply",
        "GET",
        "/api/v1/chat/s1",
        query={"request_id": "d" * 32},
        before=reply("s1", "d" * 32, "alice"),
    ),
    Case(
        "GET of a reply under another session",
        "GET",
        "/api/v1/chat/s2",
        query={"request_id": "d" * 32},
        before=reply("s1", "d" * 32, "alice"),
    ),
    Case(
        "GET of another identity's reply",
        "GET",
        "/api/v1/chat/s1",
        query={"request_id": "d" * 32},
        identity="bob",
        before=reply("s1", "d" * 32, "alice"),
    ),
    Case(
        "GET of an owned reply without identity",
        "GET",
        "/api/v1/chat/s1",
        query={"request_id": "d" * 32},
        identity=None,
        before=reply("s1", "d" * 32, "alice"),
    ),
    Case(
        "replay of a keyed turn that has its reply",
        "POST",
        "/api/v1/chat",
        chat("s 1%x"),
        {"idempotency-key": "key-1"},
        before=reply("s 1%x", KEYED, "alice"),
    ),
    Case(
        "keyed replay of another identity's reply",
        "POST",
        "/api/v1/chat",
        chat("s 1%x"),
        {"idempotency-key": "key-1"},
        identity="bob",
        before=reply("s 1%x", request_id_for("s 1%x", "key-1", "bob", SECRET)[0], "alice"),
    ),
    Case(
        "idempotency key reused for another prompt",
        "POST",
        "/api/v1/chat",
        chat(prompt="second"),
        ASYNC | {"idempotency-key": "k2"},
        first=Case(
            "first", "POST", "/api/v1/chat", chat(prompt="first"), ASYNC | {"idempotency-key": "k2"}
        ),
    ),
]


def stopped(session: str, request_id: str, owner: str | None) -> Callable[[Any], None]:
    doc = {"error": "CANCELLED", "message": "x", "session_id": session, "request_id": request_id}
    return lambda store: store.put(ResponseRecord(request_id, session, 409, doc, owner))


CANCEL = "/api/v1/chat/s1/cancel"
RID = {"request_id": "c" * 32}
CASES += [
    Case("cancel without request_id", "POST", CANCEL),
    Case("cancel of an unknown turn", "POST", CANCEL, query=RID),
    Case(
        "cancel of a finished turn",
        "POST",
        CANCEL,
        query=RID,
        before=reply("s1", "c" * 32, "alice"),
    ),
    Case(
        "cancel of a cancelled turn",
        "POST",
        CANCEL,
        query=RID,
        before=stopped("s1", "c" * 32, "alice"),
    ),
    Case(
        "cancel of another identity's turn",
        "POST",
        CANCEL,
        query=RID,
        before=ticket("s1", "c" * 32, "bob"),
    ),
    Case(
        "cancel without a session store",
        "POST",
        CANCEL,
        query=RID,
        before=ticket("s1", "c" * 32, "alice"),
    ),
    Case(
        "reject without a session store",
        "POST",
        "/api/v1/chat",
        chat(multitask_strategy="reject"),
        ASYNC,
    ),
]


def config(identity: str | None) -> AKConfig:
    base = AKConfig.load()
    keys = [{"user": u, "key": k} for u, k in KEYS.items()]
    auth = AuthConfig(enabled=True, api_keys=keys, aliases=ALIASES)
    api = {
        "max_body_bytes": 262_144,
        "auth": auth if identity else AuthConfig(),
        "idempotency_secret": SecretStr(SECRET),
    }
    return base.model_copy(update={"api": base.api.model_copy(update=api)})


def front(identity: str | None, case: Case) -> RequestHandler:
    registry = AgentRegistry()
    registry.register(Agent("echo", lambda turn: "ok"))
    store = InMemoryResponseStore()
    case.before(store)
    return RequestHandler(InMemoryTransport(), store, config(identity), registry)


def via_fastapi(case: Case) -> tuple[int, Any, dict[str, str]]:
    app = front(case.identity, case).build_app()

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
            for request in filter(None, (case.first, case)):
                headers = dict(request.headers)
                if case.identity is not None:
                    headers["x-api-key"] = KEYS[case.identity]
                response = await client.request(
                    request.method,
                    request.path,
                    content=request.body,
                    headers=headers,
                    params=request.query,
                )
        return response

    response = asyncio.run(send())
    return response.status_code, response.json(), _headers(dict(response.headers))


def via_lambda(case: Case, version: str) -> tuple[int, Any, dict[str, str]]:
    Lambda.reset()
    Lambda.use_front(front(case.identity, case))
    try:
        for request in filter(None, (case.first, case)):
            answer = Lambda.handler(_event(request, case.identity, version))
    finally:
        Lambda.reset()
    return answer["statusCode"], json.loads(answer["body"]), _headers(answer["headers"])


def _event(case: Case, identity: str | None, version: str) -> dict[str, Any]:
    body = base64.b64encode(case.body).decode() if case.body else None
    if version == "2.0":
        authorizer = {"jwt": {"claims": {"sub": identity}}} if identity else None
        return {
            "version": "2.0",
            "rawPath": case.path,
            "headers": case.headers,
            "queryStringParameters": case.query or None,
            "requestContext": {"http": {"method": case.method}, "authorizer": authorizer},
            "body": body,
            "isBase64Encoded": True,
        }
    return {
        "path": case.path,
        "httpMethod": case.method,
        "headers": case.headers,
        "queryStringParameters": case.query or None,
        "requestContext": {"authorizer": {"principalId": identity}} if identity else {},
        "body": body,
        "isBase64Encoded": True,
    }


def _headers(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() in HEADERS}


def _normal(answer: tuple[int, Any, dict[str, str]]) -> tuple[int, Any, dict[str, str]]:
    """Fresh request ids differ between two runs by design: the same placeholder for each."""
    status, doc, headers = answer
    text = FRESH_ID.sub("<id>", json.dumps(doc, sort_keys=True).replace(KEYED, "<keyed>"))
    return status, json.loads(text), {k: FRESH_ID.sub("<id>", v) for k, v in headers.items()}


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    Lambda.reset()
    yield
    Lambda.reset()


@pytest.mark.parametrize("version", ["2.0", "1.0"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fastapi_and_lambda_answer_alike(case: Case, version: str) -> None:
    http = _normal(via_fastapi(case))
    lam = _normal(via_lambda(case, version))
    assert lam == http
    assert http[0] != 500, http  # every case is an ordinary answer, never an internal error


def test_the_corpus_covers_what_callers_meet() -> None:
    """The cases above answer what docs/http-api.md says (so 'alike' is not 'alike and wrong')."""
    seen = {case.name: _normal(via_fastapi(case)) for case in CASES}
    assert seen["async post"][0] == 202
    assert seen["async post, other Prefer tokens"][0] == 202
    assert seen["Prefer that only contains the word"][0] == 200  # not async: the stored reply
    assert seen["keyed async post with a session to quote"][2]["location"].startswith(
        "/api/v1/chat/s%251?request_id="
    )
    codes = {name: answer[1].get("error") for name, answer in seen.items()}
    assert codes["malformed JSON"] == codes["not an object"] == "INVALID_JSON"
    assert seen["oversized body"][0] == 413 and seen["unknown agent"][0] == 404
    assert codes["GET of a pending turn"] == "PENDING"
    assert codes["GET of another identity's pending turn"] == "NOT_FOUND"
    assert seen["GET of a reply"][0] == 200
    assert seen["cancel without request_id"][0] == 400
    assert codes["cancel of an unknown turn"] == "NOT_FOUND"
    assert codes["cancel of another identity's turn"] == "NOT_FOUND"
    assert codes["cancel of a finished turn"] == "ALREADY_FINISHED"
    assert seen["cancel of a cancelled turn"][0] == 200
    assert seen["cancel of a cancelled turn"][1]["status"] == "CANCELLED"
    assert codes["cancel without a session store"] == "TURN_CONTROL_UNAVAILABLE"
    assert codes["reject without a session store"] == "TURN_CONTROL_UNAVAILABLE"
    for name in (
        "GET of a reply under another session",
        "GET of another identity's reply",
        "GET of an owned reply without identity",
        "keyed replay of another identity's reply",
    ):
        assert (seen[name][0], codes[name]) == (404, "NOT_FOUND"), name
    assert seen["replay of a keyed turn that has its reply"][1]["result"] == "done"
    assert codes["idempotency key reused for another prompt"] == "IDEMPOTENCY_KEY_REUSED"
