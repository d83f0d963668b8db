"""The OpenAPI document a client generator reads: every JSON answer of the routes has a schema."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import Server

CHAT_ROUTES = [
    ("/api/v1/chat", "post"),
    ("/api/v1/chat/{session_id}", "get"),
    ("/api/v1/chat/{session_id}/stream", "get"),
]


@pytest.fixture
def spec(server: Server) -> dict[str, Any]:
    response = server.client.get("/openapi.json")
    assert response.status_code == 200
    return dict(response.json())


def resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node: Any = spec
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return dict(node)


def json_schema(spec: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    return resolve(spec, response["content"]["application/json"]["schema"])


@pytest.mark.parametrize(("path", "method"), CHAT_ROUTES)
def test_every_json_answer_of_a_chat_route_has_a_schema_with_properties(
    spec: dict[str, Any], path: str, method: str
) -> None:
    responses = spec["paths"][path][method]["responses"]
    for status, response in responses.items():
        if "application/json" not in response.get("content", {}):
            assert status == "200" and "text/event-stream" in response["content"], status
            continue
        schema = json_schema(spec, response)
        assert schema.get("properties"), f"{method} {path} {status} has no typed schema"


def test_the_chat_answers_name_their_fields(spec: dict[str, Any]) -> None:
    post = spec["paths"]["/api/v1/chat"]["post"]["responses"]
    reply = json_schema(spec, post["200"])
    assert {"result", "session_id", "request_id", "agent", "attempt"} <= set(reply["properties"])
    assert set(reply["required"]) >= {"result", "session_id", "request_id"}
    assert "text/event-stream" in post["200"]["content"]
    accepted = json_schema(spec, post["202"])
    assert {"status", "request_id", "session_id"} <= set(accepted["properties"])
    error = json_schema(spec, post["422"])
    assert {"error", "message", "details", "request_id"} <= set(error["properties"])
    assert set(error["required"]) == {"error", "message"}
    detail = resolve(spec, error["properties"]["details"]["anyOf"][0]["items"])
    assert set(detail["properties"]) == {"field", "message"}
    poll = spec["paths"]["/api/v1/chat/{session_id}"]["get"]["responses"]
    assert json_schema(spec, poll["200"]) == reply


def test_the_service_routes_are_typed(spec: dict[str, Any]) -> None:
    agents = json_schema(spec, spec["paths"]["/api/v1/agents"]["get"]["responses"]["200"])
    item = resolve(spec, agents["properties"]["agents"]["items"])
    assert {"name", "description", "streaming"} <= set(item["properties"])
    health = json_schema(spec, spec["paths"]["/health"]["get"]["responses"]["200"])
    assert health["properties"]["status"]
    ready = spec["paths"]["/ready"]["get"]["responses"]
    assert "status" in json_schema(spec, ready["200"])["properties"]
    assert "error" in json_schema(spec, ready["503"])["properties"]


def test_the_documented_answers_are_what_the_server_sends(server: Server) -> None:
    """The schema's required fields are in real answers (200, 202, 422)."""
    spec = server.client.get("/openapi.json").json()
    post = spec["paths"]["/api/v1/chat"]["post"]["responses"]
    answers = {
        "200": server.client.post("/api/v1/chat", json={"session_id": "o", "prompt": "hi"}),
        "202": server.client.post(
            "/api/v1/chat",
            json={"session_id": "o", "prompt": "hi"},
            headers={"Prefer": "respond-async"},
        ),
        "422": server.client.post("/api/v1/chat", json={"prompt": "hi"}),
    }
    for status, response in answers.items():
        assert str(response.status_code) == status, response.text
        schema = json_schema(spec, post[status])
        assert set(schema.get("required", [])) <= set(response.json()), status
        assert set(response.json()) <= set(schema["properties"]), status
