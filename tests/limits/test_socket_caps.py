"""Caps on open WebSockets per process and per identity (issue 24): real uvicorn, real clients."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus

from agentkernel.core.config.auth import AuthConfig
from agentkernel.core.config.limits import LimitsConfig
from tests.api.conftest import Server, start_server  # noqa: F401 - fixture

KEYS = {"alice": "alice-key-limits-1", "bob": "bob-key-limits-2"}


@pytest.fixture
def capped(start_server: Any) -> Server:  # noqa: F811
    auth = {"enabled": True, "api_keys": [{"user": u, "key": k} for u, k in KEYS.items()]}
    return start_server(
        auth=AuthConfig.model_validate(auth),
        limits=LimitsConfig(ws_connections=3, ws_connections_per_identity=2),
    )


def open_socket(server: Server, user: str) -> Any:
    url = server.url.replace("http://", "ws://") + "/ws"
    return ws_client.connect(url, additional_headers={"X-API-Key": KEYS[user]}, open_timeout=10)


def refused(server: Server, user: str) -> Any:
    with pytest.raises(InvalidStatus) as caught:
        open_socket(server, user).close()
    return caught.value.response


def served(ws: Any) -> bool:
    ws.send(json.dumps({"session_id": f"s-{id(ws)}", "prompt": "hi", "agent": "echo"}))
    return bool(json.loads(ws.recv(timeout=10))["type"] == "CHAT_QUEUED")


def test_one_identity_cannot_hold_more_than_its_share(capped: Server) -> None:
    with contextlib.ExitStack() as stack:
        mine = [stack.enter_context(open_socket(capped, "alice")) for _ in range(2)]
        response = refused(capped, "alice")
        assert response.status_code == 429
        assert response.headers["Retry-After"] == "5"
        assert json.loads(response.body)["error"] == "TOO_MANY_CONNECTIONS"
        assert all(served(ws) for ws in mine)  # the open ones are untouched
        assert served(stack.enter_context(open_socket(capped, "bob")))  # others still get in


def test_the_process_cap_holds_across_identities_and_frees_on_close(capped: Server) -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(open_socket(capped, "alice"))
        stack.enter_context(open_socket(capped, "alice"))
        last = stack.enter_context(open_socket(capped, "bob"))
        assert refused(capped, "bob").status_code == 429
        last.close()
        assert served(stack.enter_context(reopen(capped, "bob")))  # its place was given back


def reopen(server: Server, user: str) -> Any:
    """A socket opened once the server has seen an earlier one close (it hears of the close a
    moment after the client's close handshake ends)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return open_socket(server, user)
        except InvalidStatus:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_without_authentication_the_process_cap_applies(start_server: Any) -> None:  # noqa: F811
    server = start_server(limits=LimitsConfig(ws_connections=2))
    url = server.url.replace("http://", "ws://") + "/ws"
    with ws_client.connect(url), ws_client.connect(url), pytest.raises(InvalidStatus) as caught:
        ws_client.connect(url, open_timeout=10).close()
    assert caught.value.response.status_code == 429
    with reopen_anonymous(url) as ws:
        assert served(ws)


def reopen_anonymous(url: str) -> Any:
    deadline = time.monotonic() + 5
    while True:
        try:
            return ws_client.connect(url, open_timeout=10)
        except InvalidStatus:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
