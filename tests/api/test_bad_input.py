"""Malformed, oversized and hostile input gets a clear 4xx and is never enqueued."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueName

from .conftest import Server


@pytest.fixture
def transport() -> InMemoryTransport:
    return InMemoryTransport()


@pytest.fixture
def guarded(start_server, transport: InMemoryTransport) -> Server:  # type: ignore[no-untyped-def]
    return start_server(transport=transport, max_body_bytes=4096)


def sent(transport: InMemoryTransport) -> int:
    return transport.depth(QueueName.INPUT)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "INVALID_JSON"),
        (b"", 400, "INVALID_JSON"),
        (b"[1, 2]", 400, "INVALID_JSON"),
        (b"\xff\xfe\x00", 400, "INVALID_JSON"),
        (b"[" * 2000 + b"]" * 2000, 400, "INVALID_JSON"),
        # deep but parseable: refused before it is queued (the runner's parser stops near 200)
        (
            b'{"session_id": "s", "prompt": "hi", "x": ' + b"[" * 230 + b"]" * 230 + b"}",
            400,
            "INVALID_JSON",
        ),
        (
            b'{"session_id": "s", "prompt": "hi", "x": ' + b"[" * 600 + b"]" * 600 + b"}",
            400,
            "INVALID_JSON",
        ),
        (b'{"prompt": "hi"}', 422, "INVALID_REQUEST"),
        (b'{"session_id": "s"}', 422, "INVALID_REQUEST"),
        (b'{"session_id": "s", "prompt": ""}', 422, "INVALID_REQUEST"),
        (b'{"session_id": 7, "prompt": "hi"}', 422, "INVALID_REQUEST"),
        (b'{"session_id": "s", "prompt": ["hi"]}', 422, "INVALID_REQUEST"),
        (b'{"session_id": "bad\\nid", "prompt": "hi"}', 422, "INVALID_REQUEST"),
        (json.dumps({"session_id": "s" * 300, "prompt": "hi"}).encode(), 422, "INVALID_REQUEST"),
        (b'{"session_id": "s", "prompt": "hi", "agent": "nobody"}', 404, "AGENT_NOT_FOUND"),
    ],
)
def test_bad_bodies(
    guarded: Server, transport: InMemoryTransport, body: bytes, status: int, code: str
) -> None:
    response = guarded.client.post(
        "/api/v1/chat", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert response.json()["error"] == code
    assert sent(transport) == 0


def test_oversized_body_with_length_is_413(guarded: Server, transport: InMemoryTransport) -> None:
    body = json.dumps({"session_id": "s", "prompt": "x" * 5000})
    response = guarded.client.post("/api/v1/chat", content=body)
    assert (response.status_code, response.json()["error"]) == (413, "BODY_TOO_LARGE")
    assert sent(transport) == 0


def test_oversized_chunked_body_is_413(guarded: Server, transport: InMemoryTransport) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"session_id": "s", "prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    response = guarded.client.post("/api/v1/chat", content=chunks())
    assert response.status_code == 413
    assert sent(transport) == 0


def test_lying_content_length_cannot_sneak_past_the_limit(guarded: Server) -> None:
    host, port = guarded.url.removeprefix("http://").split(":")
    body = b'{"session_id": "s", "prompt": "' + b"x" * 6000 + b'"}'
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /api/v1/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n" + body)
        reply = sock.recv(4096)
    assert reply.split(b" ")[1] in (b"400", b"413")


def test_unicode_prompt_and_extra_fields_reach_the_agent(guarded: Server) -> None:
    response = guarded.client.post(
        "/api/v1/chat", json={"session_id": "ü-日本", "prompt": "héllo ✓", "meta": {"k": [1]}}
    )
    assert response.status_code == 200
    assert response.json()["result"] == "héllo ✓ #1"


def test_poll_without_request_id_is_400(guarded: Server) -> None:
    response = guarded.client.get("/api/v1/chat/s")
    assert (response.status_code, response.json()["error"]) == (400, "INVALID_REQUEST")


def test_unknown_request_id_is_404(guarded: Server) -> None:
    response = guarded.client.get("/api/v1/chat/s", params={"request_id": "nope"})
    assert response.status_code == 404


def test_bad_idempotency_key_is_400(guarded: Server) -> None:
    response = guarded.client.post(
        "/api/v1/chat",
        json={"session_id": "s", "prompt": "p"},
        headers={"Idempotency-Key": "k" * 300},
    )
    assert response.status_code == 400


@pytest.mark.parametrize("session_id", ["a/b", "/", "..", ".", "x/../y"])
def test_session_ids_that_cannot_be_polled_are_refused(
    guarded: Server, transport: InMemoryTransport, session_id: str
) -> None:
    response = guarded.client.post("/api/v1/chat", json={"session_id": session_id, "prompt": "p"})
    assert (response.status_code, response.json()["error"]) == (422, "INVALID_REQUEST")
    assert response.json()["details"][0]["field"] == "session_id"
    assert sent(transport) == 0


@pytest.mark.parametrize("session_id", ["a?b=c&d", "100%2Fsure", "x#y", "sp ace", "ü…日本", "a\\b"])
def test_awkward_session_ids_round_trip_through_the_location(
    guarded: Server, session_id: str
) -> None:
    response = guarded.client.post(
        "/api/v1/chat",
        json={"session_id": session_id, "prompt": "p"},
        headers={"Prefer": "respond-async"},
    )
    assert response.status_code == 202, response.text
    location = response.headers["location"]
    deadline = time.monotonic() + 10
    while (reply := guarded.client.get(location)).status_code == 404:
        assert time.monotonic() < deadline, "reply never readable at its Location"
        time.sleep(0.02)
    assert (reply.status_code, reply.json()["session_id"]) == (200, session_id)


def test_a_stalled_body_is_answered_408_and_the_connection_closed(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(body_timeout=0.5)
    host, port = server.url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"POST /api/v1/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"session_id": "s", '
        )  # ... and the rest of the body never comes
        reply = b""
        while chunk := sock.recv(4096):  # ends when the server closes the connection
            reply += chunk
    assert reply.split(b" ")[1] == b"408", reply
    assert b"BODY_TIMEOUT" in reply
    assert time.monotonic() - started < 3.0  # before: held until the client gave up


def test_a_slow_but_steady_body_within_the_timeout_is_fine(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(body_timeout=2.0)

    def trickle():  # type: ignore[no-untyped-def]
        yield b'{"session_id": "slow", '
        time.sleep(0.3)
        yield b'"prompt": "hi"}'

    response = server.client.post("/api/v1/chat", content=trickle())
    assert (response.status_code, response.json()["result"]) == (200, "hi #1")


@pytest.mark.parametrize("request_id", ["x" * 10_000, "../../etc/passwd", "\x00", "ü;DROP", "*"])
def test_hostile_request_ids_on_poll_are_a_plain_404(guarded: Server, request_id: str) -> None:
    response = guarded.client.get("/api/v1/chat/s", params={"request_id": request_id})
    assert (response.status_code, response.json()["error"]) == (404, "NOT_FOUND")


def test_a_trickling_body_cannot_outlast_the_body_timeout(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(body_timeout=0.5)

    def trickle():  # type: ignore[no-untyped-def]
        yield b'{"session_id": "s", "prompt": "'
        for _ in range(20):  # a byte every 0.1 s: never idle long, but 2 s in all
            time.sleep(0.1)
            yield b"x"
        yield b'"}'

    started = time.monotonic()
    try:
        response = server.client.post("/api/v1/chat", content=trickle())
    except httpx.HTTPError:
        pass  # the server may close while the client is still sending; either way it ended
    else:
        assert (response.status_code, response.json()["error"]) == (408, "BODY_TIMEOUT")
    assert time.monotonic() - started < 3.0
