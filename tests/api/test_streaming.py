"""Token streaming over SSE and WebSocket against a real uvicorn server (embedded pipeline)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosedError

from agentkernel import Agent, AgentRegistry
from agentkernel.pipeline.process.io_handler import IOHandler

from .conftest import Server, make_config, poll

TICK = 0.3


async def ticker(turn):  # type: ignore[no-untyped-def]
    for i in range(4):
        if i:
            await asyncio.sleep(TICK)
        yield f"t{i} "


async def midfail(turn):  # type: ignore[no-untyped-def]
    yield "one "
    yield "two "
    raise ValueError("lost the thread")


def plain(turn):  # type: ignore[no-untyped-def]
    return f"plain {turn.prompt}"


@pytest.fixture
def server() -> Iterator[Server]:
    registry = AgentRegistry()
    for name, fn in (("ticker", ticker), ("midfail", midfail), ("plain", plain)):
        registry.register(Agent(name, fn))
    config = make_config(stream_heartbeat=0.2)
    server = Server(IOHandler(config, registry=registry, with_runner=True))
    yield server
    server.close()


SSE = {"Accept": "text/event-stream"}


def read_events(response: httpx.Response) -> list[tuple[int, dict[str, Any], float, int]]:
    """(id, frame, arrival time, keep-alives before it) for each event of an SSE response."""
    events, event_id, comments = [], None, 0
    for line in response.iter_lines():
        if line.startswith(":"):
            comments += 1
        elif line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            events.append((event_id, json.loads(line[6:]), time.monotonic(), comments))
    return events


def stream_turn(server: Server, session: str, agent: str, **headers: str) -> list[Any]:
    body = {"session_id": session, "prompt": "go", "agent": agent}
    with server.client.stream("POST", "/api/v1/chat", json=body, headers=SSE | headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return read_events(r)


def test_sse_chunks_arrive_while_the_agent_runs_then_done(server: Server) -> None:
    events = stream_turn(server, "s1", "ticker")
    ids = [e[0] for e in events]
    frames = [e[1] for e in events]
    assert ids == [0, 1, 2, 3, 4]
    assert [f.get("delta") for f in frames[:4]] == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert all(f["type"] == "STREAM_CHUNK" and f["session_id"] == "s1" for f in frames)
    assert frames[-1]["done"] is True and frames[-1]["result"] == "t0 t1 t2 t3 "
    first, last = events[0][2], events[3][2]
    assert last - first > 2 * TICK, "chunks were not delivered as the agent produced them"
    # The joined reply is stored like any other, so GET answers after a streamed turn.
    reply = poll(server.client, "s1", frames[0]["request_id"]).json()
    assert reply["result"] == "t0 t1 t2 t3 "


def test_sse_a_non_streaming_agent_streams_one_chunk(server: Server) -> None:
    frames = [e[1] for e in stream_turn(server, "s2", "plain")]
    assert [f.get("delta") for f in frames] == ["plain go", None]
    assert frames[-1]["result"] == "plain go"


def test_sse_an_agent_failing_mid_stream_ends_with_an_error_frame(server: Server) -> None:
    frames = [e[1] for e in stream_turn(server, "s3", "midfail")]
    assert [f.get("delta") for f in frames[:2]] == ["one ", "two "]
    assert frames[-1]["done"] is True
    assert (frames[-1]["error"], frames[-1]["status_code"]) == ("AGENT_ERROR", 500)
    assert "lost the thread" in frames[-1]["message"]


def test_sse_keep_alives_are_sent_while_waiting(server: Server) -> None:
    events = stream_turn(server, "s4", "ticker")
    assert events[-1][3] >= 2, "no keep-alive comment while the agent was between chunks"


def test_sse_resume_with_last_event_id(server: Server) -> None:
    events = stream_turn(server, "s5", "ticker")
    request_id = events[0][1]["request_id"]
    path = "/api/v1/chat/s5/stream"
    with server.client.stream(
        "GET", path, params={"request_id": request_id}, headers={"Last-Event-ID": "1"}
    ) as r:
        resumed = read_events(r)
    assert [e[0] for e in resumed] == [2, 3, 4]
    assert resumed[-1][1]["result"] == "t0 t1 t2 t3 "
    # under another session: refused before the first byte of a stream
    other = server.client.get("/api/v1/chat/other/stream", params={"request_id": request_id})
    assert (other.status_code, other.json()["error"]) == (404, "NOT_FOUND")


def test_sse_resume_of_a_turn_nobody_sent_ends_at_once(server: Server) -> None:
    # once: keep-alives for 15 s (the heartbeat), then TIMEOUT; now 404 before any stream byte
    r = server.client.get("/api/v1/chat/zz/stream", params={"request_id": "unknown-1"}, timeout=5)
    assert (r.status_code, r.json()["error"]) == (404, "NOT_FOUND")


def test_sse_idempotent_retry_replays_the_same_turn(server: Server) -> None:
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = [e[1] for e in stream_turn(server, "s6", "ticker", **key)]
    again = [e[1] for e in stream_turn(server, "s6", "ticker", **key)]
    assert first == again


def test_sse_validation_errors_are_plain_json(server: Server) -> None:
    r = server.client.post("/api/v1/chat", json={"prompt": "no session"}, headers=SSE)
    assert (r.status_code, r.headers["content-type"]) == (422, "application/json")
    r = server.client.post(
        "/api/v1/chat", json={"session_id": "s", "prompt": "x", "agent": "nope"}, headers=SSE
    )
    assert r.status_code == 404


def test_sse_client_disconnect_does_not_break_the_turn(server: Server) -> None:
    body = {"session_id": "s7", "prompt": "go", "agent": "ticker"}
    with server.client.stream("POST", "/api/v1/chat", json=body, headers=SSE) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                request_id = json.loads(line[6:])["request_id"]
                break
    reply = poll(server.client, "s7", request_id)
    assert reply.json()["result"] == "t0 t1 t2 t3 "


# -- WebSocket -----------------------------------------------------------------------------------


def ws_url(server: Server) -> str:
    return server.url.replace("http://", "ws://") + "/ws"


def receive(ws: Any, until: int, timeout: float = 10) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while len(frames) < until:
        frames.append(json.loads(ws.recv(timeout=timeout)))
    return frames


def test_ws_many_sessions_and_turns_over_one_socket(server: Server) -> None:
    with ws_client.connect(ws_url(server)) as ws:
        ws.send(
            json.dumps(
                {"route": "chat", "body": {"session_id": "a", "prompt": "1", "agent": "plain"}}
            )
        )
        ws.send(json.dumps({"session_id": "b", "prompt": "2", "agent": "plain"}))  # flat frame
        ws.send(
            json.dumps(
                {
                    "route": "chat",
                    "request_id": "client-req-1",
                    "body": {"session_id": "c", "prompt": "3", "agent": "ticker", "stream": True},
                }
            )
        )
        frames = receive(ws, 3 + 2 + 5)
    queued = [f for f in frames if f["type"] == "CHAT_QUEUED"]
    assert sorted(f["session_id"] for f in queued) == ["a", "b", "c"]
    responses = {f["session_id"]: f for f in frames if f["type"] == "CHAT_RESPONSE"}
    assert responses["a"]["result"] == "plain 1" and responses["b"]["status_code"] == 200
    chunks = [f for f in frames if f["type"] == "STREAM_CHUNK"]
    assert all(f["request_id"] == "client-req-1" for f in chunks)
    assert [f.get("index") for f in chunks] == [0, 1, 2, 3, None]
    assert chunks[-1]["result"] == "t0 t1 t2 t3 "


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        ("not json", "INVALID_JSON"),
        ("[1, 2]", "INVALID_JSON"),
        ("[" * 10000 + "]" * 10000, "INVALID_JSON"),
        (json.dumps({"route": "admin"}), "UNKNOWN_ROUTE"),
        (json.dumps({"body": "text"}), "INVALID_REQUEST"),
        (json.dumps({"body": {"prompt": "no session"}}), "INVALID_REQUEST"),
        (
            json.dumps({"request_id": "../x", "body": {"session_id": "s", "prompt": "p"}}),
            "INVALID_REQUEST_ID",
        ),
        (
            json.dumps({"body": {"session_id": "s", "prompt": "p", "agent": "nope"}}),
            "AGENT_NOT_FOUND",
        ),
    ],
)
def test_ws_bad_frames_get_a_system_response_and_the_socket_stays(
    server: Server, frame: str, error: str
) -> None:
    with ws_client.connect(ws_url(server), max_size=None) as ws:
        ws.send(frame)
        [answer] = receive(ws, 1)
        assert (answer["type"], answer["error"]) == ("SYSTEM_RESPONSE", error)
        ws.send(json.dumps({"session_id": "after", "prompt": "ok", "agent": "plain"}))
        frames = receive(ws, 2)
    assert frames[-1]["result"] == "plain ok"


def test_ws_a_frame_over_the_body_limit_closes_the_socket_unread(server: Server) -> None:
    # refused by the WebSocket protocol on the frame's declared length (1009), not read and
    # answered: reading 16 MB frames to refuse them held hundreds of MB (issue 24)
    with ws_client.connect(ws_url(server), max_size=None) as ws:
        ws.send(json.dumps({"session_id": "s", "prompt": "x" * 2_000_000}))
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_ws_a_request_id_reused_for_another_turn_is_refused(server: Server) -> None:
    def frame(session: str, prompt: str) -> str:
        body = {"session_id": session, "prompt": prompt, "agent": "plain"}
        return json.dumps({"request_id": "client-req-reused", "body": body})

    with ws_client.connect(ws_url(server)) as ws:
        ws.send(frame("r", "first"))
        assert receive(ws, 2)[-1]["result"] == "plain first"
        for other in (frame("r", "second"), frame("someone-else", "first")):
            ws.send(other)
            [answer] = receive(ws, 1)
            assert (answer["type"], answer["error"]) == (
                "SYSTEM_RESPONSE",
                "IDEMPOTENCY_KEY_REUSED",
            )
            assert answer["request_id"] == "client-req-reused"


def test_ws_a_socket_closed_mid_turn_leaves_the_turn_running(server: Server) -> None:
    with ws_client.connect(ws_url(server)) as ws:
        ws.send(
            json.dumps({"session_id": "gone", "prompt": "go", "agent": "ticker", "stream": True})
        )
        queued = json.loads(ws.recv(timeout=10))
    reply = poll(server.client, "gone", queued["request_id"])
    assert reply.json()["result"] == "t0 t1 t2 t3 "


# -- the chat command ----------------------------------------------------------------------------


def chat_command(server: Server, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agentkernel", "chat", "--url", server.url, *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)


def test_chat_command_streams_the_reply(server: Server) -> None:
    done = chat_command(server, "--session", "cli", "--agent", "ticker", "--stream", "go")
    assert (done.returncode, done.stdout) == (0, "t0 t1 t2 t3 \n"), done.stderr


def test_chat_command_reports_a_failed_stream(server: Server) -> None:
    done = chat_command(server, "--session", "cli2", "--agent", "midfail", "--stream", "go")
    assert done.returncode == 1
    assert done.stdout == "one two " and "AGENT_ERROR" in done.stderr


def test_chat_command_without_a_prompt_is_interactive(server: Server) -> None:
    lines = "hello\n\nagain\n/quit\nnot sent\n"
    done = chat_command(server, "--session", "cli3", "--agent", "plain", stdin=lines)
    assert (done.returncode, done.stdout) == (0, "plain hello\nplain again\n"), done.stderr


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ({"body": {"prompt": "no session"}}, "session_id"),
        ({"session_id": "s", "prompt": 7}, "prompt"),
        ({"body": {"session_id": "s", "prompt": "p", "stream": "maybe"}}, "stream"),
        ({"body": "text"}, "body"),
    ],
)
def test_ws_invalid_request_names_the_field_as_http_does(
    server: Server, frame: dict[str, object], field: str
) -> None:
    with ws_client.connect(ws_url(server), max_size=None) as ws:
        ws.send(json.dumps(frame))
        [answer] = receive(ws, 1)
    assert (answer["type"], answer["error"]) == ("SYSTEM_RESPONSE", "INVALID_REQUEST")
    assert answer["details"][0]["field"] == field and answer["details"][0]["message"]
    assert field in answer["message"]
    if "body" in frame and isinstance(frame["body"], dict):  # the same fields as over HTTP
        http = server.client.post("/api/v1/chat", json=frame["body"])
        assert [d["field"] for d in http.json()["details"]] == [
            d["field"] for d in answer["details"]
        ]
