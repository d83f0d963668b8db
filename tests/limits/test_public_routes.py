"""/metrics and /docs can be opened to a scraper while the API keeps its credential (issue 24)."""

from __future__ import annotations

from typing import Any

import pytest

from agentkernel.core.config.auth import AuthConfig
from agentkernel.core.config.limits import LimitsConfig
from tests.api.conftest import start_server  # noqa: F401 - fixture

AUTH = AuthConfig.model_validate(
    {"enabled": True, "api_keys": [{"user": "ops", "key": "ops-key-public-routes"}]}
)


@pytest.mark.parametrize(
    ("routes", "open_paths", "closed_paths"),
    [
        ([], [], ["/metrics", "/docs", "/openapi.json"]),
        (["metrics"], ["/metrics"], ["/docs", "/openapi.json"]),
        (["docs"], ["/docs", "/openapi.json"], ["/metrics"]),
        (["metrics", "docs"], ["/metrics", "/docs", "/openapi.json"], []),
    ],
)
def test_public_routes_open_only_themselves(
    start_server: Any,  # noqa: F811
    routes: list[str],
    open_paths: list[str],
    closed_paths: list[str],
) -> None:
    server = start_server(auth=AUTH, limits=LimitsConfig.model_validate({"public_routes": routes}))
    for path in open_paths:
        assert server.client.get(path).status_code == 200, path
    for path in closed_paths:
        assert server.client.get(path).status_code == 401, path
    # the API itself still needs the credential, whatever is public
    assert server.client.get("/api/v1/agents").status_code == 401
    posted = server.client.post("/api/v1/chat", json={"session_id": "p", "prompt": "hi"})
    assert posted.status_code == 401
    with_key = server.client.get("/api/v1/agents", headers={"X-API-Key": "ops-key-public-routes"})
    assert with_key.status_code == 200


def test_an_unknown_public_route_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="public_routes"):
        LimitsConfig.model_validate({"public_routes": ["chat"]})
