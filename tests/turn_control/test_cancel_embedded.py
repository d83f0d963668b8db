"""Cancelling turns on the embedded server: running (async and sync agents), queued, finished,
by another identity, over HTTP (sync, async, SSE) and WebSocket."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import pytest
from tests.api.conftest import Server
from tests.turn_control.helpers import WATCH, cancel, post_async, reply
from websockets.sync.client import connect

from agentkernel.core.config.auth import AuthConfig


def sid() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


def test_a_running_async_turn_is_cancelled_within_a_second(server: Server) -> None:
    c, s, prompt = server.client, sid(), f"p-{uuid.uuid4().hex}"
    rid = post_async(c, s, prompt, agent="long", seconds=30)
    WATCH.wait_started(prompt)
    began = time.monotonic()
    answer = cancel(c, s, rid)
    took = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "CANCELLED"
    assert answer.json()["reply"]["error"] == "CANCELLED"
    assert took < 1.0, took
    assert prompt in WATCH.cancelled and prompt not in WATCH.finished
    final = reply(c, s, rid)
    assert final.status_code == 409
    assert final.json()["error"] == "CANCELLED" and final.json()["request_id"] == rid


def test_a_cancelled_turn_leaves_the_session_state_as_it_was(server: Server) -> None:
    c, s = server.client, sid()
    first, second, third = (f"p{i}-{uuid.uuid4().hex}" for i in range(3))
    done = post_async(c, s, first, agent="long", seconds=0)
    assert reply(c, s, done).status_code == 200
    rid = post_async(c, s, second, agent="long", seconds=30)
    WATCH.wait_started(second)
    assert cancel(c, s, rid).status_code == 200
    post_async(c, s, third, agent="long", seconds=0)
    WATCH.wait_started(third)
    assert WATCH.states[third] == {"prompts": [first]}  # nothing of the cancelled turn


def test_a_sync_agent_is_told_through_the_turn(server: Server) -> None:
    c, s, prompt = server.client, sid(), f"p-{uuid.uuid4().hex}"
    rid = post_async(c, s, prompt, agent="sync_long", seconds=30)
    WATCH.wait_started(prompt)
    assert cancel(c, s, rid).json()["status"] == "CANCELLED"
    deadline = time.monotonic() + 2
    while prompt not in WATCH.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prompt in WATCH.cancelled and prompt not in WATCH.finished


def test_a_queued_turn_never_runs(server: Server) -> None:
    c, s = server.client, sid()
    ahead, queued = f"a-{uuid.uuid4().hex}", f"q-{uuid.uuid4().hex}"
    first = post_async(c, s, ahead, agent="long", seconds=1.0)
    WATCH.wait_started(ahead)
    rid = post_async(c, s, queued, agent="long", seconds=0)
    answer = cancel(c, s, rid)  # answered once the turn ahead ended and the runner reached it
    assert answer.status_code == 200, answer.text
    assert reply(c, s, first).status_code == 200  # the turn ahead is untouched
    assert reply(c, s, rid).json()["error"] == "CANCELLED"
    time.sleep(0.2)
    assert queued not in WATCH.runs


def test_a_cancel_not_confirmed_in_time_answers_202(serve: Callable[..., Server]) -> None:
    server = serve()
    server.handler.api.turn_ops.config = server.handler.config.execution.turn_control.model_copy(
        update={"cancel_wait": 0.2}
    )
    c, s = server.client, sid()
    ahead, queued = f"a-{uuid.uuid4().hex}", f"q-{uuid.uuid4().hex}"
    first = post_async(c, s, ahead, agent="long", seconds=1.5)
    WATCH.wait_started(ahead)
    rid = post_async(c, s, queued, agent="long", seconds=0)
    answer = cancel(c, s, rid)
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "CANCEL_REQUESTED"
    assert answer.headers["Location"].endswith(f"request_id={rid}")
    assert reply(c, s, first).status_code == 200
    assert reply(c, s, rid).json()["error"] == "CANCELLED"
    assert queued not in WATCH.runs


def test_cancel_is_idempotent_and_a_finished_turn_answers_409(server: Server) -> None:
    c, s, prompt = server.client, sid(), f"p-{uuid.uuid4().hex}"
    rid = post_async(c, s, prompt, agent="long", seconds=30)
    WATCH.wait_started(prompt)
    assert cancel(c, s, rid).status_code == 200
    again = cancel(c, s, rid)
    assert again.status_code == 200 and again.json()["status"] == "CANCELLED"
    done = post_async(c, s, f"d-{uuid.uuid4().hex}", agent="long", seconds=0)
    assert reply(c, s, done).status_code == 200
    late = cancel(c, s, done)
    assert late.status_code == 409
    assert late.json()["error"] == "ALREADY_FINISHED" and late.json()["status_code"] == 200


def test_a_sync_caller_gets_the_cancelled_outcome(server: Server) -> None:
    c, s, prompt = server.client, sid(), f"p-{uuid.uuid4().hex}"
    got: list[httpx.Response] = []
    body = {"session_id": s, "prompt": prompt, "agent": "long", "seconds": 30}
    key = uuid.uuid4().hex
    waiter = threading.Thread(
        target=lambda: got.append(
            httpx.post(f"{server.url}/api/v1/chat", json=body, headers={"Idempotency-Key": key})
        )
    )
    waiter.start()
    WATCH.wait_started(prompt)
    rid = next(r for r in _poll_ids(c, s, key))
    assert cancel(c, s, rid).status_code == 200
    waiter.join(5)
    assert got and got[0].status_code == 409 and got[0].json()["error"] == "CANCELLED"


def _poll_ids(c: httpx.Client, s: str, key: str) -> list[str]:
    """The request id of a turn sent with Idempotency-Key ``key``: a retry answers with it."""
    response = c.post(
        "/api/v1/chat",
        json={"session_id": s, "prompt": "x", "agent": "long"},
        headers={"Idempotency-Key": key, "Prefer": "respond-async"},
    )
    # Another body under the same key is refused, naming the turn the key belongs to.
    assert response.status_code == 422, response.text
    return [response.json()["request_id"]]


def test_a_stream_ends_with_the_cancelled_outcome(server: Server) -> None:
    c, s, prompt = server.client, sid(), f"p-{uuid.uuid4().hex}"
    body = {"session_id": s, "prompt": prompt, "agent": "streaming"}
    frames: list[dict[str, object]] = []
    with c.stream(
        "POST", "/api/v1/chat", json=body, headers={"Accept": "text/event-stream"}
    ) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            frame = json.loads(line[5:])
            frames.append(frame)
            if len(frames) == 3:
                answer = cancel(c, s, str(frame["request_id"]))
                assert answer.status_code == 200, answer.text
            if frame.get("done") or frame.get("error"):
                break
    last = frames[-1]
    assert last.get("error") == "CANCELLED" or last.get("status_code") == 409, last
    assert len(frames) < 60  # the agent stopped: it would have gone on for minutes


def test_nobody_else_can_cancel_a_turn(serve: Callable[..., Server]) -> None:
    keys = [
        {"user": "alice", "key": "alice-key-0123456789"},
        {"user": "bob", "key": "bob-key-0123456789"},
    ]
    server = serve(auth=AuthConfig(enabled=True, api_keys=keys))
    alice = httpx.Client(base_url=server.url, headers={"X-API-Key": keys[0]["key"]}, timeout=30)
    bob = httpx.Client(base_url=server.url, headers={"X-API-Key": keys[1]["key"]}, timeout=30)
    s, prompt = sid(), f"p-{uuid.uuid4().hex}"
    with alice, bob:
        rid = post_async(alice, s, prompt, agent="long", seconds=30)
        WATCH.wait_started(prompt)
        refused = cancel(bob, s, rid)
        assert refused.status_code == 404 and refused.json()["error"] == "NOT_FOUND"
        assert cancel(alice, sid(), rid).status_code == 404  # another session of the owner
        assert (
            httpx.post(f"{server.url}/api/v1/chat/{s}/cancel?request_id={rid}").status_code == 401
        )
        assert prompt not in WATCH.cancelled
        assert cancel(alice, s, rid).status_code == 200


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/chat/s1/cancel", 400),  # no request_id
        ("/api/v1/chat/s1/cancel?request_id=", 400),
        ("/api/v1/chat/s1/cancel?request_id=nope", 404),
        ("/api/v1/chat/s1/cancel?request_id=" + "x" * 5000, 404),
        ("/api/v1/chat/s1/cancel?request_id=%00%ff", 404),
    ],
)
def test_malformed_cancels_get_clear_errors(server: Server, path: str, status: int) -> None:
    response = server.client.post(path)
    assert response.status_code == status, response.text
    assert response.json()["error"] in {"INVALID_REQUEST", "NOT_FOUND"}


def test_a_websocket_cancel_frame(server: Server) -> None:
    s, prompt, client_id = sid(), f"p-{uuid.uuid4().hex}", f"client-{uuid.uuid4().hex[:8]}"
    url = server.url.replace("http://", "ws://") + "/ws"
    with connect(url) as ws:
        chat = {
            "request_id": client_id,
            "body": {"session_id": s, "prompt": prompt, "agent": "long"},
        }
        ws.send(json.dumps(chat))
        assert json.loads(ws.recv(5))["type"] == "CHAT_QUEUED"
        WATCH.wait_started(prompt)
        ws.send(json.dumps({"route": "cancel", "request_id": client_id, "session_id": s}))
        frames = [json.loads(ws.recv(5)), json.loads(ws.recv(5))]
        by_type = {f["type"]: f for f in frames}
        assert by_type["CANCEL_RESPONSE"]["status_code"] == 200
        assert by_type["CANCEL_RESPONSE"]["request_id"] == client_id
        assert by_type["CHAT_RESPONSE"]["status_code"] == 409
        assert by_type["CHAT_RESPONSE"]["error"] == "CANCELLED"
        ws.send(json.dumps({"route": "cancel", "session_id": s}))  # no request_id
        refused = json.loads(ws.recv(5))
        assert refused["type"] == "SYSTEM_RESPONSE" and refused["error"] == "INVALID_REQUEST"
        ws.send(json.dumps({"route": "cancel", "request_id": client_id, "session_id": "a/b"}))
        assert json.loads(ws.recv(5))["error"] == "INVALID_REQUEST"
        ws.send(json.dumps({"route": "cancel", "request_id": "unknown-123", "session_id": s}))
        unknown = json.loads(ws.recv(5))
        assert unknown["type"] == "CANCEL_RESPONSE" and unknown["status_code"] == 404
