"""Every non-2xx answer is the documented JSON error object, and the OpenAPI lists them."""

from __future__ import annotations

import pytest

from .conftest import Server


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("DELETE", "/api/v1/chat", 405, "METHOD_NOT_ALLOWED"),
        ("PUT", "/health", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/api/v1/chat/s", 400, "INVALID_REQUEST"),
        ("GET", "/api/v1/chat/s/stream", 400, "INVALID_REQUEST"),
        ("GET", "/health/", 404, "NOT_FOUND"),  # not an empty 307 redirect
        ("GET", "/api/v1/agents/", 404, "NOT_FOUND"),
    ],
)
def test_errors_are_json_objects(
    server: Server, method: str, path: str, status: int, error: str
) -> None:
    response = server.client.request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == error and isinstance(body["message"], str)


def test_openapi_lists_every_status_of_the_chat_routes(server: Server) -> None:
    paths = server.client.get("/openapi.json").json()["paths"]
    post = paths["/api/v1/chat"]["post"]["responses"]
    assert {"200", "202", "400", "401", "404", "408", "413", "422", "500", "503", "504"} <= set(
        post
    )
    assert "INVALID_IDEMPOTENCY_KEY" in post["400"]["description"]
    assert "IDEMPOTENCY_KEY_REUSED" in post["422"]["description"]
    get = paths["/api/v1/chat/{session_id}"]["get"]["responses"]
    assert {"200", "400", "401", "404", "503"} <= set(get)
    assert "PENDING" in get["404"]["description"]
    assert {"500", "504"} <= set(get)  # a stored AGENT_ERROR or TURN_TIMEOUT
    assert "TURN_TIMEOUT" in post["504"]["description"]
    stream = paths["/api/v1/chat/{session_id}/stream"]["get"]["responses"]
    assert {"200", "400", "401"} <= set(stream)
    assert "503" in paths["/ready"]["get"]["responses"]
    for route in ("/api/v1/agents", "/metrics"):
        assert "401" in paths[route]["get"]["responses"]
