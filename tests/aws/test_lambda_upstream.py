"""The request handler as upstream Agent Kernel users call it: routes registered with keywords,
custom routes under the API base path, and upstream's poll forms (query and JSON body), each
read through the same owner and session checks as the seed's path form."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from agentkernel.auth import AuthValidator, ValidationResult
from agentkernel.aws import Lambda, WebsocketConnectionHandler
from tests.aws.lambda_harness import LambdaContext, http_v2, rest_v1, websocket
from tests.aws.test_lambda import Deployment, body_of, chat, connection, d

pytestmark = pytest.mark.aws
__all__ = ["d"]  # the deployment fixture of the Lambda suite


def register_upstream_routes() -> None:
    """What an upstream request handler file holds (the deploy guide's example, as written)."""

    @Lambda.register("/app", method="GET")
    def app_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"response": "Hello from app route"}

    @Lambda.register(route="app_info/", method="post")
    def app_info_handler(event: dict[str, Any], context: Any) -> tuple[int, dict[str, Any]]:
        payload = json.loads(event.get("body") or "{}")
        return 201, {"response": "Hello from app_info route", "got": payload}

    @Lambda.register(route="/version")
    def version(event: dict[str, Any], context: Any) -> str:
        return "0.9.5"

    @Lambda.register(route="/raw", method="GET")
    def raw(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"statusCode": 418, "body": "teapot", "headers": {"X-Raw": "1"}}


@pytest.mark.parametrize("make", [http_v2, rest_v1])
def test_custom_routes_answer_at_their_path_and_under_the_api_base_path(
    d: Deployment, make: Any
) -> None:
    register_upstream_routes()
    for path in ("/app", "/api/v1/app"):
        got = Lambda.handler(make("GET", path), LambdaContext())
        assert (got["statusCode"], body_of(got)) == (200, {"response": "Hello from app route"})
    posted = Lambda.handler(make("POST", "/api/v1/app_info", {"x": 1}), LambdaContext())
    assert posted["statusCode"] == 201
    assert body_of(posted)["got"] == {"x": 1}
    text = Lambda.handler(make("GET", "/api/v1/version"), LambdaContext())
    assert (text["statusCode"], text["body"]) == (200, "0.9.5")
    assert text["headers"]["Content-Type"].startswith("text/plain")
    raw = Lambda.handler(make("GET", "/api/v1/raw"), LambdaContext())
    assert (raw["statusCode"], raw["body"], raw["headers"]) == (418, "teapot", {"X-Raw": "1"})


def test_a_function_serving_only_custom_routes_needs_no_queue_or_table() -> None:
    """Nothing is configured: the routes answer without the chat front being built."""
    Lambda.reset()
    try:
        register_upstream_routes()
        for path in ("/app", "/api/v1/app"):
            got = Lambda.handler(http_v2("GET", path), LambdaContext())
            assert (got["statusCode"], body_of(got)) == (200, {"response": "Hello from app route"})
    finally:
        Lambda.reset()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/app"),  # registered for GET only
        ("GET", "/api/v2/app"),  # another base path
        ("GET", "/api/v1/api/v1/app"),
        ("GET", "/xapi/v1/app"),
        ("GET", "/api/v1app"),
        ("GET", "/api/v1/"),
    ],
)
def test_a_custom_route_is_not_found_under_other_paths_or_methods(
    d: Deployment, method: str, path: str
) -> None:
    register_upstream_routes()
    got = Lambda.handler(http_v2(method, path), LambdaContext())
    assert (got["statusCode"], body_of(got)["error"]) == (404, "NOT_FOUND")


def test_a_custom_route_that_fails_answers_a_json_500_without_its_message(d: Deployment) -> None:
    @Lambda.register(route="/boom", method="GET")
    def boom(event: dict[str, Any], context: Any) -> Any:
        raise RuntimeError("secret-db-password")

    @Lambda.register(route="/odd", method="GET")
    def odd(event: dict[str, Any], context: Any) -> Any:
        return {"not json": object()}

    for path in ("/api/v1/boom", "/boom", "/api/v1/odd"):
        got = Lambda.handler(http_v2("GET", path), LambdaContext())
        assert (got["statusCode"], body_of(got)["error"]) == (500, "INTERNAL_ERROR")
        assert "secret" not in got["body"]


def test_upstream_terraform_variables_name_the_base_path_and_the_agent_endpoint(
    d: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {
        "API_BASE_PATH": "agents",
        "API_VERSION": "v2",
        "AGENT_ENDPOINT": "run",
    }.items():
        monkeypatch.setenv(key, value)
    register_upstream_routes()
    assert body_of(Lambda.handler(http_v2("GET", "/agents/v2/app")))["response"]
    assert body_of(Lambda.handler(http_v2("GET", "/api/v1/app")))["response"]
    event = http_v2("POST", "/agents/v2/run", chat("tf", "hi"), headers={"prefer": "respond-async"})
    accepted = Lambda.handler(event, LambdaContext())
    assert accepted["statusCode"] == 202
    d.run_turns()
    poll = {"session_id": "tf", "request_id": body_of(accepted)["request_id"]}
    got = Lambda.handler(http_v2("GET", "/agents/v2/run", poll), LambdaContext())
    assert (got["statusCode"], json.loads(body_of(got)["result"])) == (200, ["hi"])


# -- the poll forms --------------------------------------------------------------------------------


def as_user(event: dict[str, Any], who: str) -> dict[str, Any]:
    """The event as API Gateway passes it after a Lambda authorizer named ``who``."""
    event["requestContext"]["authorizer"] = {"principalId": who}
    return event


def by_query(session: str, request_id: str, who: str) -> dict[str, Any]:
    query = {"request_id": request_id, "session_id": session}
    return as_user(http_v2("GET", "/api/v1/chat", query=query), who)


def by_body(session: str, request_id: str, who: str) -> dict[str, Any]:
    body = {"request_id": request_id, "session_id": session}
    return as_user(rest_v1("GET", "/api/v1/chat", body), who)


def by_envelope(session: str, request_id: str, who: str) -> dict[str, Any]:
    """Upstream's request envelope: the request id outside, the run's fields under ``body``."""
    body = {"request_id": request_id, "body": {"session_id": session}}
    return as_user(http_v2("GET", "/api/v1/chat", body, b64=True), who)


def by_path(session: str, request_id: str, who: str) -> dict[str, Any]:
    query = {"request_id": request_id}
    return as_user(http_v2("GET", f"/api/v1/chat/{session}", query=query), who)


@pytest.mark.parametrize("read", [by_query, by_body, by_envelope, by_path])
def test_every_poll_form_reads_only_its_owners_reply_in_its_session(
    d: Deployment, read: Any
) -> None:
    session = f"p-{uuid.uuid4().hex[:6]}"
    event = as_user(
        http_v2("POST", "/api/v1/chat", chat(session, "mine"), headers={"prefer": "respond-async"}),
        "alice",
    )
    request_id = body_of(Lambda.handler(event, LambdaContext()))["request_id"]

    def status(session_id: str, who: str) -> tuple[int, str | None]:
        got = Lambda.handler(read(session_id, request_id, who), LambdaContext())
        return got["statusCode"], body_of(got).get("error")

    assert status(session, "alice") == (404, "PENDING")
    assert status(session, "bob") == (404, "NOT_FOUND")  # another's turn is not even pending
    d.run_turns()
    got = Lambda.handler(read(session, request_id, "alice"), LambdaContext())
    assert (got["statusCode"], json.loads(body_of(got)["result"])) == (200, ["mine"])
    assert status(session, "bob") == (404, "NOT_FOUND")
    assert status("another-session", "alice") == (404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("event", "status", "error"),
    [
        (http_v2("GET", "/api/v1/chat"), 400, "INVALID_REQUEST"),
        (http_v2("GET", "/api/v1/chat", query={"request_id": "r1"}), 400, "INVALID_REQUEST"),
        (http_v2("GET", "/api/v1/chat", query={"session_id": "s1"}), 400, "INVALID_REQUEST"),
        (http_v2("GET", "/api/v1/chat", {"request_id": "r1"}), 400, "INVALID_REQUEST"),
        (
            http_v2("GET", "/api/v1/chat", {"session_id": "s", "request_id": 7}),
            400,
            "INVALID_REQUEST",
        ),
        (
            http_v2("GET", "/api/v1/chat", {"session_id": ["s"], "request_id": "r"}),
            400,
            "INVALID_REQUEST",
        ),
        (
            http_v2("GET", "/api/v1/chat", {"session_id": "", "request_id": "r"}),
            400,
            "INVALID_REQUEST",
        ),
        (http_v2("GET", "/api/v1/chat", {"request_id": "r", "body": "s"}), 400, "INVALID_REQUEST"),
        (http_v2("GET", "/api/v1/chat", "not json"), 400, "INVALID_JSON"),
        (http_v2("GET", "/api/v1/chat", "[1, 2]"), 400, "INVALID_JSON"),
        (http_v2("GET", "/api/v1/chat", "[" * 100_000), 400, "INVALID_JSON"),
        (http_v2("GET", "/api/v1/chat", b"\xff\xfe".decode("latin-1")), 400, "INVALID_JSON"),
        (
            http_v2("GET", "/api/v1/chat", '{"session_id": "\\ud800", "request_id": "r"}'),
            400,
            "INVALID_TEXT",
        ),
        (
            http_v2("GET", "/api/v1/chat", {"session_id": "s", "request_id": "x" * 2_000_000}),
            413,
            "BODY_TOO_LARGE",
        ),
        (
            http_v2("GET", "/api/v1/chat", query={"session_id": "s", "request_id": "nobody"}),
            404,
            "NOT_FOUND",
        ),
    ],
)
def test_malformed_polls_get_json_errors(
    d: Deployment, event: dict[str, Any], status: int, error: str
) -> None:
    got = Lambda.handler(event, LambdaContext())
    assert (got["statusCode"], body_of(got)["error"]) == (status, error)


# -- the WebSocket connection handler -------------------------------------------------------------


class Tokens(AuthValidator):
    def validate(self, token: str) -> ValidationResult:
        if token == "good":
            return ValidationResult(True, claims={"sub": "alice"})
        return ValidationResult(False, error_msg="unknown token")


def test_the_connection_handler_takes_its_validator_by_upstreams_keyword(d: Deployment) -> None:
    handler = WebsocketConnectionHandler.set_auth_validator(auth_validator=Tokens()).handler
    assert handler(websocket("CONNECT", "kw-bad", query={"token": "bad"}))["statusCode"] == 401
    assert handler(websocket("CONNECT", "kw-ok", query={"token": "good"}))["statusCode"] == 200
    assert connection(d, "kw-bad") is None
    assert connection(d, "kw-ok")["user_id"] == {"S": "token:alice"}  # type: ignore[index]
