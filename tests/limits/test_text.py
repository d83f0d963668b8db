"""Client text that must not forge log lines or crash a front (issue 24, items 7 and 8): real
uvicorn, real HTTP and WebSocket clients."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import websockets.sync.client as ws_client

from agentkernel.core.redact import PrintableFilter, printable
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueName
from tests.api.conftest import Server, start_server  # noqa: F401 - fixture

jwt = pytest.importorskip("jwt", reason="JWT support needs the 'auth' extra")

SECRET = "hs256-limits-secret-of-enough-length-0123456789"
FORGED = "2026-11-30 00:00:00 INFO agentkernel.auth: FORGED"
SEPARATORS = ["\u0085", "\u2028", "\u2029", "\x1b", "\u200e"]


def token(user: str) -> str:
    return jwt.encode({"sub": user, "exp": time.time() + 60}, SECRET, algorithm="HS256")


@pytest.mark.parametrize("separator", SEPARATORS)
def test_printable_escapes_every_non_printable_character(separator: str) -> None:
    escaped = printable(f"eve{separator}{FORGED}")
    assert escaped.isprintable() and separator not in escaped
    assert escaped == "eve" + separator.encode("unicode_escape").decode() + FORGED


def test_printable_escapes_a_lone_surrogate_and_keeps_ordinary_text() -> None:
    assert printable("a\ud800b") == "a\\ud800b"
    assert printable("héllo wörld, 日本") == "héllo wörld, 日本"


def test_the_log_filter_makes_one_record_one_line() -> None:
    record = logging.LogRecord("x", logging.INFO, "f", 1, "session %s", ("a\u2028b",), None)
    PrintableFilter().filter(record)
    assert record.getMessage() == "session a\\u2028b"


@pytest.fixture
def logged(start_server) -> Iterator[Server]:  # type: ignore[no-untyped-def]  # noqa: F811
    auth = {"enabled": True, "jwt": {"secret": SECRET}}
    from agentkernel.core.config.auth import AuthConfig

    yield start_server(auth=AuthConfig.model_validate(auth), access_log=True)


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "agentkernel.access"]


@pytest.mark.parametrize("separator", ["\u0085", "\u2028"])
def test_access_log_escapes_unicode_line_separators_of_users_and_sessions(
    logged: Server, caplog: pytest.LogCaptureFixture, separator: str
) -> None:
    headers = {"Authorization": f"Bearer {token(f'eve{separator}{FORGED}')}"}
    session = f"s{separator}{FORGED}"
    with caplog.at_level(logging.INFO, logger="agentkernel.access"):
        posted = logged.client.post(
            "/api/v1/chat", json={"session_id": session, "prompt": "hi"}, headers=headers
        )
        logged.client.get(f"/api/v1/chat/{session}", params={"request_id": "r" * 32})
        url = logged.url.replace("http://", "ws://") + "/ws?token=" + token(f"w{separator}x")
        with ws_client.connect(url) as ws:
            ws.send(json.dumps({"session_id": session, "prompt": "hi"}))
            ws.recv(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(access_lines(caplog)) < 3:
            time.sleep(0.05)
    assert posted.status_code == 200, posted.text
    lines = access_lines(caplog)
    assert len(lines) >= 3, lines
    for line in lines:
        assert line.isprintable(), line
    escaped = separator.encode("unicode_escape").decode()
    assert any(f"user=eve{escaped}2026" in line for line in lines), lines
    assert any(f"/api/v1/chat/s{escaped}2026" in line for line in lines), lines
    assert any(f"user=w{escaped}x" in line for line in lines), lines


# -- item 8: a lone surrogate is a 400 naming the field, nothing queued ------------------------

SURROGATE_BODIES = [
    (b'{"session_id": "s", "prompt": "hi", "note": "\\ud800"}', "note"),
    (b'{"session_id": "s", "prompt": "hi", "meta": {"tags": ["ok", "\\udfff"]}}', "meta.tags.1"),
    (b'{"session_id": "s", "prompt": "hi\\ud83d"}', "prompt"),
    (b'{"session_id": "s", "prompt": "hi", "\\ud800k": 1}', "\\ud800k"),
]


@pytest.mark.parametrize(("body", "field"), SURROGATE_BODIES)
def test_a_lone_surrogate_is_a_400_naming_the_field_and_nothing_is_queued(
    start_server: Any,  # noqa: F811
    body: bytes,
    field: str,
) -> None:
    transport = InMemoryTransport()
    server = start_server(transport=transport)
    response = server.client.post(
        "/api/v1/chat",
        content=body,
        headers={"Content-Type": "application/json", "Prefer": "respond-async"},
    )
    assert response.status_code == 400, response.text
    doc = response.json()
    assert (doc["error"], doc["field"]) == ("INVALID_TEXT", field)
    assert transport.depth(QueueName.INPUT) == 0


def test_a_well_formed_surrogate_pair_is_ordinary_text(start_server: Any) -> None:  # noqa: F811
    server = start_server()
    body = b'{"session_id": "pair", "prompt": "hi \\ud83d\\ude00", "agent": "echo"}'
    response = server.client.post(
        "/api/v1/chat", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["result"] == "hi \U0001f600 #1"


def test_a_lone_surrogate_in_a_websocket_frame_is_a_system_response(
    start_server: Any,  # noqa: F811
) -> None:
    transport = InMemoryTransport()
    server = start_server(transport=transport)
    with ws_client.connect(server.url.replace("http://", "ws://") + "/ws") as ws:
        ws.send('{"session_id": "s", "prompt": "hi", "note": "\\ud800"}')
        frame = json.loads(ws.recv(timeout=10))
    assert (frame["type"], frame["error"]) == ("SYSTEM_RESPONSE", "INVALID_TEXT")
    assert "note" in frame["message"]
    assert transport.depth(QueueName.INPUT) == 0
