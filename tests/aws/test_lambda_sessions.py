"""The sessions API on the Lambda request handler: the same front, SQS and DynamoDB on moto."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from agentkernel import Agent, AgentRegistry, Module
from agentkernel.aws import Lambda, ResponseHandler, ServerlessAgentRunner
from agentkernel.aws import WebsocketConnectionHandler as Connections
from tests.aws.lambda_harness import http_v2
from tests.aws.test_lambda import Deployment
from tests.stores.test_session_stores import create_session_table

pytestmark = pytest.mark.aws
SESSIONS = "/api/v1/sessions"


def remember(turn):  # type: ignore[no-untyped-def]
    turn.state.setdefault("seen", []).append(turn.prompt)
    return json.dumps(turn.state["seen"])


class SessionsDeployment(Deployment):
    """The Lambda deployment with its sessions in a DynamoDB table that has the owner index."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(monkeypatch)
        self.sessions = f"sess-{uuid.uuid4().hex[:10]}"
        create_session_table(self.sessions)
        monkeypatch.setenv("AK_SESSION__TYPE", "dynamodb")
        monkeypatch.setenv("AK_SESSION__DYNAMODB__TABLE_NAME", self.sessions)


@pytest.fixture
def d(aws: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[SessionsDeployment]:
    for cls in (Lambda, ServerlessAgentRunner, ResponseHandler, Connections):
        cls.reset()
    AgentRegistry.reset()
    Module([Agent("remember", remember)])
    deployment = SessionsDeployment(monkeypatch)
    yield deployment
    deployment.management.close()
    for cls in (Lambda, ServerlessAgentRunner, ResponseHandler, Connections):
        cls.reset()
    AgentRegistry.reset()


def call(who: str, method: str, path: str, **more: Any) -> tuple[int, Any]:
    event = http_v2(method, path, **more)
    event["requestContext"]["authorizer"] = {"lambda": {}, "principalId": who}
    response = Lambda.handler(event)
    body = response["body"]
    return response["statusCode"], json.loads(body) if body else None


def turn(d: SessionsDeployment, who: str, session: str, prompt: str) -> str:
    body = {"session_id": session, "prompt": prompt}
    status, doc = call(who, "POST", "/api/v1/chat", body=body, headers={"prefer": "respond-async"})
    assert status == 202, doc
    d.run_turns()
    return str(doc["request_id"])


def stored(*tables: str) -> str:
    dynamodb = boto3.client("dynamodb")
    return json.dumps([dynamodb.scan(TableName=t)["Items"] for t in tables])


def test_list_show_and_erase_owner_scoped(d: SessionsDeployment) -> None:
    gone = turn(d, "alice", "s1", "one")
    turn(d, "alice", "s2", "two")
    kept = turn(d, "bob", "s1", "bob's")
    status, page = call("alice", "GET", SESSIONS)
    assert status == 200 and [s["session_id"] for s in page["sessions"]] == ["s2", "s1"]
    assert [s["session_id"] for s in call("bob", "GET", SESSIONS)[1]["sessions"]] == ["s1"]
    status, refused = call("bob", "GET", f"{SESSIONS}/s2")  # alice's: as if it did not exist
    assert (status, refused["error"]) == (404, "NOT_FOUND")
    status, shown = call("alice", "GET", f"{SESSIONS}/s1")
    assert status == 200 and shown["state"] == {"seen": ["one"]}
    assert shown["turns"][0]["request_id"] == gone
    assert gone in stored(d.table)
    assert call("alice", "DELETE", f"{SESSIONS}/s1") == (204, None)
    assert call("alice", "GET", f"{SESSIONS}/s1")[0] == 404
    assert gone not in stored(d.table, d.sessions)
    assert kept in stored(d.table)
    assert call("bob", "GET", f"{SESSIONS}/s1")[1]["state"] == {"seen": ["bob's"]}


@pytest.mark.parametrize(
    ("method", "path", "query"),
    [
        ("GET", SESSIONS, {"limit": "1000"}),
        ("GET", SESSIONS, {"cursor": "%%%"}),
        ("GET", f"{SESSIONS}/{'x' * 300}", None),
        ("DELETE", f"{SESSIONS}/a\x01b", None),
    ],
)
def test_hostile_input_gets_a_4xx_json_answer(
    d: SessionsDeployment, method: str, path: str, query: dict[str, str] | None
) -> None:
    status, doc = call("alice", method, path, query=query)
    assert 400 <= status < 500 and isinstance(doc, dict) and "error" in doc
