"""Multitask strategies on the embedded server: what a second message does to the session's
turns still queued or running."""

from __future__ import annotations

import time
import uuid

from tests.api.conftest import Server
from tests.turn_control.helpers import WATCH, post_async, reply

from agentkernel.core.config.turns import MultitaskStrategy


def sid() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


def prompt(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex}"


def test_enqueue_is_the_default_and_waits_in_line(server: Server) -> None:
    c, s, a, b = server.client, sid(), prompt("a"), prompt("b")
    first = post_async(c, s, a, agent="long", seconds=0.5)
    WATCH.wait_started(a)
    second = post_async(c, s, b, agent="long", seconds=0)
    assert reply(c, s, first).status_code == 200
    assert reply(c, s, second).status_code == 200
    assert WATCH.states[b] == {"prompts": [a]}


def test_reject_refuses_while_a_turn_is_queued_or_running(server: Server) -> None:
    c, s, a = server.client, sid(), prompt("a")
    first = post_async(c, s, a, agent="long", seconds=1.0)
    WATCH.wait_started(a)
    body = {"session_id": s, "prompt": prompt("b"), "agent": "long", "multitask_strategy": "reject"}
    refused = c.post("/api/v1/chat", json=body)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "SESSION_BUSY" and refused.json()["session_id"] == s
    assert refused.headers["Retry-After"] == "1"
    # A poll of the refused turn says so (it is not left PENDING).
    polled = reply(c, s, refused.json()["request_id"])
    assert polled.status_code == 409 and polled.json()["error"] == "SESSION_BUSY"
    assert reply(c, s, first).status_code == 200  # the turn it met is untouched
    body["prompt"] = prompt("c")
    body["seconds"] = 0
    assert c.post("/api/v1/chat", json=body).status_code == 200  # the session is idle again


def test_interrupt_cancels_the_running_turn_and_keeps_its_state(server: Server) -> None:
    c, s, a, b = server.client, sid(), prompt("a"), prompt("b")
    first = post_async(c, s, a, agent="long", seconds=30)
    WATCH.wait_started(a)
    began = time.monotonic()
    second = post_async(c, s, b, agent="long", seconds=0, multitask_strategy="interrupt")
    ended = reply(c, s, first)
    assert time.monotonic() - began < 1.5
    assert ended.status_code == 409
    doc = ended.json()
    assert doc["error"] == "CANCELLED" and doc["reason"] == "interrupt"
    assert doc["cancelled_by"] == second
    assert reply(c, s, second).status_code == 200
    assert WATCH.states[b] == {"prompts": [a]}  # what the interrupted turn wrote is kept
    assert a in WATCH.cancelled


def test_rollback_cancels_the_running_turn_and_keeps_nothing(server: Server) -> None:
    c, s, zero, a, b = server.client, sid(), prompt("z"), prompt("a"), prompt("b")
    assert reply(c, s, post_async(c, s, zero, agent="long", seconds=0)).status_code == 200
    first = post_async(c, s, a, agent="long", seconds=30)
    WATCH.wait_started(a)
    second = post_async(c, s, b, agent="long", seconds=0, multitask_strategy="rollback")
    doc = reply(c, s, first).json()
    assert doc["error"] == "CANCELLED" and doc["reason"] == "rollback"
    assert doc["cancelled_by"] == second
    assert reply(c, s, second).status_code == 200
    assert WATCH.states[b] == {"prompts": [zero]}  # nothing of the rolled-back turn


def test_coalesce_replaces_a_queued_turn_and_lets_the_running_one_finish(server: Server) -> None:
    c, s = server.client, sid()
    a, b, d = prompt("a"), prompt("b"), prompt("d")
    running = post_async(c, s, a, agent="long", seconds=1.0)
    WATCH.wait_started(a)
    queued = post_async(c, s, b, agent="long", seconds=0)
    newest = post_async(c, s, d, agent="long", seconds=0, multitask_strategy="coalesce")
    assert reply(c, s, running).status_code == 200  # it had started: it runs to its end
    replaced = reply(c, s, queued)
    assert replaced.status_code == 409
    assert replaced.json()["error"] == "SUPERSEDED"
    assert replaced.json()["superseded_by"] == newest
    assert reply(c, s, newest).status_code == 200
    assert b not in WATCH.runs
    assert WATCH.states[d] == {"prompts": [a]}


def test_a_strategy_only_touches_its_own_session(server: Server) -> None:
    c, s, other, a = server.client, sid(), sid(), prompt("a")
    first = post_async(c, s, a, agent="long", seconds=0.5)
    WATCH.wait_started(a)
    post_async(c, other, prompt("b"), agent="long", seconds=0, multitask_strategy="rollback")
    assert reply(c, s, first).status_code == 200


def test_the_default_strategy_comes_from_config(server: Server) -> None:
    api = server.handler.api
    api.turn_ops.config = api.turn_ops.config.model_copy(
        update={"multitask_strategy": MultitaskStrategy.REJECT}
    )
    c, s, a = server.client, sid(), prompt("a")
    first = post_async(c, s, a, agent="long", seconds=1.0)
    WATCH.wait_started(a)
    busy = c.post("/api/v1/chat", json={"session_id": s, "prompt": "b", "agent": "long"})
    assert busy.status_code == 409 and busy.json()["error"] == "SESSION_BUSY"
    explicit = {"session_id": s, "prompt": prompt("c"), "agent": "long", "seconds": 0}
    explicit["multitask_strategy"] = "enqueue"
    assert c.post("/api/v1/chat", json=explicit).status_code == 200
    assert reply(c, s, first).status_code == 200


def test_an_unknown_strategy_is_refused(server: Server) -> None:
    for bad in ("nope", 3, None, ["reject"], "REJECT", "x" * 10_000):
        body = {"session_id": sid(), "prompt": "hi", "seconds": 0, "multitask_strategy": bad}
        response = server.client.post("/api/v1/chat", json=body)
        if bad is None:
            assert response.status_code == 200
            continue
        assert response.status_code == 422, (bad, response.text)
        assert response.json()["details"][0]["field"] == "multitask_strategy"
