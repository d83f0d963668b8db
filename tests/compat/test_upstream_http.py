"""Upstream clients on the FastAPI front: its poll form, its agents list, and the extra
routes and token validator an upstream IO entry file hands to ``ECSIOHandler.run``.

Real uvicorn servers; every request goes over HTTP.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import APIRouter

from agentkernel.api import RESTRequestHandler
from agentkernel.auth import AuthValidator, ValidationResult
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.process.io_handler import IOHandler
from tests.api.conftest import Server, make_config, registry


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server(IOHandler(make_config(), registry=registry(), with_runner=True))
    yield running
    running.close()


def _poll_query(client: httpx.Client, session: str, request_id: str) -> httpx.Response:
    deadline = time.monotonic() + 10
    while True:
        got = client.get("/api/v1/chat", params={"request_id": request_id, "session_id": session})
        if got.status_code != 404 or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_upstreams_poll_form_reads_what_the_path_form_reads(server: Server) -> None:
    session = f"q-{uuid.uuid4().hex[:6]}"
    body = {"session_id": session, "prompt": "hi", "agent": "slow", "seconds": 0.4}
    accepted = server.client.post("/api/v1/chat", json=body, headers={"Prefer": "respond-async"})
    assert accepted.status_code == 202
    request_id = accepted.json()["request_id"]
    query = {"request_id": request_id, "session_id": session}
    early = server.client.get("/api/v1/chat", params=query)
    assert (early.status_code, early.json()["error"]) == (404, "PENDING")
    by_query = _poll_query(server.client, session, request_id)
    by_path = server.client.get(f"/api/v1/chat/{session}", params={"request_id": request_id})
    assert by_query.status_code == 200 and by_query.json() == by_path.json()
    assert by_query.json()["result"] == "slept"


def test_the_poll_form_applies_the_session_rule(server: Server) -> None:
    session = f"r-{uuid.uuid4().hex[:6]}"
    reply = server.client.post("/api/v1/chat", json={"session_id": session, "prompt": "x"})
    request_id = reply.json()["request_id"]
    other = server.client.get(
        "/api/v1/chat", params={"request_id": request_id, "session_id": "someone-else"}
    )
    assert (other.status_code, other.json()["error"]) == (404, "NOT_FOUND")
    assert "x #1" not in other.text


@pytest.mark.parametrize(
    ("query", "status", "error"),
    [
        ({"request_id": "r1"}, 400, "INVALID_REQUEST"),  # upstream allowed no session; not here
        ({"session_id": "s1"}, 400, "INVALID_REQUEST"),
        ({}, 400, "INVALID_REQUEST"),
        ({"request_id": "", "session_id": ""}, 400, "INVALID_REQUEST"),
        ({"request_id": "r1", "session_id": "s\x00\n1"}, 404, "NOT_FOUND"),
        ({"request_id": "../../etc/passwd", "session_id": "s1"}, 404, "NOT_FOUND"),
        ({"request_id": "r" * 5000, "session_id": "s" * 5000}, 404, "NOT_FOUND"),
    ],
)
def test_the_poll_form_answers_bad_input_with_json_errors(
    server: Server, query: dict[str, str], status: int, error: str
) -> None:
    got = server.client.get("/api/v1/chat", params=query)
    assert (got.status_code, got.json()["error"]) == (status, error), got.text


def test_the_poll_route_leaves_post_and_other_methods_alone(server: Server) -> None:
    assert server.client.put("/api/v1/chat", json={}).status_code == 405
    posted = server.client.post("/api/v1/chat", json={"session_id": "p", "prompt": "still"})
    assert posted.status_code == 200 and posted.json()["result"] == "still #1"


def test_the_agents_list_has_upstreams_shape_and_keeps_the_details(server: Server) -> None:
    doc = server.client.get("/api/v1/agents").json()
    names = doc["agents"]  # an upstream client: a list of agent names
    assert names == ["echo", "slow", "broken", "flaky", "once", "words", "trace"]
    assert all(isinstance(name, str) for name in names)
    details = {d["name"]: d for d in doc["details"]}
    assert details["words"]["streaming"] is True
    assert details["echo"]["description"] == "echo test agent"


# -- what an upstream IO entry file passes to ECSIOHandler.run --------------------------------


class StaticTokens(AuthValidator):
    """Written as for upstream: ``validate(token, context=None)``."""

    def validate(self, token: str, context: Any = None) -> ValidationResult:
        if token == "good-token":
            return ValidationResult(is_valid=True, claims={"sub": "alice"})
        return ValidationResult(is_valid=False, error_msg="unknown token")


class StatusHandler(RESTRequestHandler):
    def status(self) -> dict[str, str]:
        return {"status": "custom"}

    def get_router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/app/status", self.status, methods=["GET"])
        router.add_api_route("/api/v1/agents", self.status, methods=["GET"])  # ours wins
        return router


def test_a_validator_and_handlers_are_served_behind_the_same_authentication() -> None:
    extra = APIRouter()
    extra.add_api_route("/app/plain", lambda: {"plain": True}, methods=["GET"])
    handler = IOHandler(
        make_config(),
        registry=registry(),
        with_runner=True,
        auth_validator=StaticTokens(),
        handlers=[StatusHandler(), extra],
    )
    server = Server(handler)
    try:
        good = {"Authorization": "Bearer good-token"}
        assert server.client.get("/app/status").status_code == 401
        assert server.client.get("/app/status", headers=good).json() == {"status": "custom"}
        assert server.client.get("/app/plain", headers=good).json() == {"plain": True}
        bad = server.client.get("/api/v1/agents", headers={"Authorization": "Bearer nope"})
        assert (bad.status_code, bad.json()["error"]) == (401, "UNAUTHORIZED")
        agents = server.client.get("/api/v1/agents", headers=good).json()
        assert "echo" in agents["agents"]  # the API's own route was not replaced
        assert server.client.get("/health").status_code == 200  # open, as always
        session = {"session_id": "owned", "prompt": "mine"}
        mine = server.client.post("/api/v1/chat", json=session, headers=good)
        assert mine.status_code == 200, mine.text
    finally:
        server.close()


@pytest.mark.parametrize("bad", [object(), "routes", 42])
def test_a_handler_without_a_router_is_refused_at_start(bad: object) -> None:
    with pytest.raises(AKConfigError, match=r"handlers: .* get_router"):
        IOHandler(make_config(), registry=registry(), handlers=[bad])  # type: ignore[list-item]


class UserIdTokens(AuthValidator):
    """Written as upstream's docs write one: the user in a ``userId`` claim, or only a
    ``subject``, or (``anyone``) no user at all with upstream's implicit default subject."""

    def validate(self, token: str, context: Any = None) -> ValidationResult:
        if token in ("alice", "bob"):
            return ValidationResult(is_valid=True, claims={"userId": token})
        if token == "carol":
            return ValidationResult(is_valid=True, subject="carol")
        if token == "anyone":
            return ValidationResult(is_valid=True)
        return ValidationResult(is_valid=False, error_msg="unknown token")


def test_upstream_validators_name_their_user_by_userid_or_subject_never_a_shared_default() -> None:
    server = Server(
        IOHandler(
            make_config(), registry=registry(), with_runner=True, auth_validator=UserIdTokens()
        )
    )
    try:

        def chat(token: str) -> httpx.Response:
            body = {"session_id": "shared-name", "prompt": "hi"}
            return server.client.post(
                "/api/v1/chat", json=body, headers={"Authorization": f"Bearer {token}"}
            )

        # One session id, three users: three sessions (each starts at #1), not one.
        assert [chat(user).json()["result"] for user in ("alice", "bob", "carol")] == ["hi #1"] * 3
        assert chat("alice").json()["result"] == "hi #2"
        nobody = chat("anyone")  # upstream would have called this user "user", shared by all
        assert nobody.status_code == 401, nobody.text
    finally:
        server.close()
