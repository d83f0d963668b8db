"""The playground's routes on a real uvicorn server: where it is on, its headers, its auth."""

from __future__ import annotations

import fnmatch
import re
import socket
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from agentkernel.aws.ecs import ECSIOHandler
from agentkernel.core.config.auth import AuthConfig
from agentkernel.pipeline.http import playground
from agentkernel.pipeline.process.io_handler import IOHandler
from tests.api.conftest import Server, make_config, registry

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "src" / "agentkernel" / "pipeline" / "http" / "static"
#: Bytes each file may take: the page is meant to stay small and load at once.
BUDGETS = {"playground.html": 4_000, "playground.js": 24_000, "playground.css": 8_000}
KEY = "carol-key-0b3e"


@pytest.fixture
def start() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(handler: type[IOHandler] = IOHandler, with_runner: bool = True, **api: Any) -> Server:
        server = Server(handler(make_config(**api), registry(), with_runner=with_runner))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def test_the_embedded_server_serves_the_page_with_a_strict_policy(
    start: Callable[..., Server],
) -> None:
    client = start().client
    root = client.get("/")
    assert (root.status_code, root.headers["location"]) == (307, "/playground")
    page = client.get("/playground")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "unsafe" not in policy and "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    script = client.get("/playground/playground.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert script.text == (STATIC / "playground.js").read_text()
    assert client.get("/playground/playground.css").headers["content-type"].startswith("text/css")
    assert "/playground" not in client.get("/openapi.json").text  # not an API route


@pytest.mark.parametrize(
    ("handler", "with_runner", "setting", "served"),
    [
        (IOHandler, False, None, False),  # agentkernel io
        (ECSIOHandler, False, None, False),
        (ECSIOHandler, True, None, False),  # agents in the IO container: still off
        (IOHandler, True, False, False),
        (IOHandler, False, True, True),
        (ECSIOHandler, False, True, True),
    ],
)
def test_off_for_an_io_process_unless_switched_on(
    start: Callable[..., Server],
    handler: type[IOHandler],
    with_runner: bool,
    setting: bool | None,
    served: bool,
) -> None:
    client = start(handler, with_runner, playground=setting).client
    expected = 200 if served else 404
    assert client.get("/playground").status_code == expected
    assert client.get("/playground/playground.js").status_code == expected
    assert client.get("/").status_code == (307 if served else 404)


@pytest.fixture
def secured(start: Callable[..., Server]) -> Server:
    auth = AuthConfig(enabled=True, api_keys=[{"user": "carol", "key": SecretStr(KEY)}])
    return start(auth=auth)


def test_with_auth_on_only_the_page_is_open(secured: Server) -> None:
    client = secured.client
    for path in ("/playground", "/playground/playground.js", "/playground/playground.css"):
        assert client.get(path).status_code == 200, path
    assert client.get("/").status_code == 307
    for path in ("/api/v1/agents", "/metrics", "/playground/other.js", "/playground/", "/x"):
        refused = client.get(path)
        assert refused.status_code == 401, path
        assert refused.json()["error"] == "UNAUTHORIZED"
    assert client.get("/api/v1/agents", headers={"X-API-Key": KEY}).status_code == 200


@pytest.mark.parametrize(
    "target",
    [
        "/playground/../api/v1/agents",
        "/playground/%2e%2e/metrics",
        "/playground/playground.js/../../metrics",
        "/playground%00",
        "//playground",
    ],
)
def test_hostile_paths_near_the_page_are_not_opened(secured: Server, target: str) -> None:
    """The open paths are exact: nothing that resolves elsewhere passes without a key."""
    host, port = secured.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert status in (400, 401), (target, answer[:200])


def test_the_page_only_writes_the_methods_it_serves(secured: Server) -> None:
    answer = secured.client.post("/playground", content=b"x")
    assert answer.status_code == 405
    assert answer.json()["error"] == "METHOD_NOT_ALLOWED"


def test_the_files_are_csp_clean_self_contained_and_small() -> None:
    html = (STATIC / "playground.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline script"
    assert not re.search(r"\son\w+\s*=", html), "inline event handler"
    assert not re.search(r"\sstyle\s*=|<style", html), "inline style (style-src 'self')"
    script = (STATIC / "playground.js").read_text()
    assert not re.search(r"innerHTML|outerHTML|eval\(|new Function|document\.write", script)
    assert "console." not in script  # nothing, the credential least of all, is logged
    for name, budget in BUDGETS.items():
        text = (STATIC / name).read_text()
        assert not re.search(r"(https?:)?//[\w.-]+\.\w+/", text), f"{name} loads from elsewhere"
        assert len(text.encode()) <= budget, (name, len(text.encode()))


def test_the_static_files_are_package_data() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["agentkernel"]
    for name in BUDGETS:
        relative = f"pipeline/http/static/{name}"
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative
    assert set(playground.PATHS) >= {"/", "/playground"}


def test_the_page_answers_through_a_plain_http_client(start: Callable[..., Server]) -> None:
    """Served without a browser too (curl, a proxy's health probe)."""
    with httpx.Client(base_url=start().url, follow_redirects=True) as client:
        answer = client.get("/")
    assert answer.url.path == "/playground" and "<title>agentkernel playground" in answer.text
