"""The chaos suite's own judgement of a reply, checked without any server (fast, always run)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.chaos.workload import Turn, check, classify


def answered(prompt: str, got: list[str], status: int = 200) -> Turn:
    turn = Turn("s", 0, prompt, started=0.0, answered=1.0, status=status)
    turn.doc = {"result": json.dumps(got)} if status == 200 else {"error": "TURN_FAILED"}
    return turn


@pytest.mark.parametrize(
    ("got", "problems"),
    [
        (["p0", "p1", "p2"], set()),
        (["p0", "p2"], {"lost"}),
        (["p0", "p1", "p1", "p2"], {"applied twice"}),
        (["p1", "p0", "p2"], {"out of order"}),
        (["p0", "p1", "x", "p2"], {"phantom"}),
        (["p0", "p0", "p2"], {"applied twice", "lost"}),
    ],
)
def test_a_reply_is_compared_with_the_prompts_answered_before_it(
    got: list[str], problems: set[str]
) -> None:
    turn = answered("p2", got)
    check(turn, ["p0", "p1"])
    assert turn.problems == problems


def test_an_error_reply_fails_a_normal_turn_but_answers_the_poison_turn() -> None:
    normal, poison = answered("p1", [], status=500), answered("POISON", [], status=500)
    check(normal, ["p0"])
    check(poison, ["p0"])
    assert (normal.problems, poison.problems) == ({"failed"}, set())


def response(status: int, body: object) -> httpx.Response:
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return httpx.Response(status, content=content)


@pytest.mark.parametrize(
    ("status", "body", "outcome"),
    [
        (200, {"result": "[]", "request_id": "r"}, "final"),
        (500, {"error": "TURN_FAILED", "request_id": "r"}, "final"),
        (202, {"status": "ACCEPTED", "request_id": "r"}, "poll"),
        (504, {"error": "TIMEOUT", "request_id": "r"}, "poll"),
        (503, {"error": "QUEUE_UNAVAILABLE"}, "retry"),
        (503, {"error": "SHUTTING_DOWN", "request_id": "r"}, "retry"),
        (500, "Internal Server Error", "retry"),
        (404, {"error": "NOT_FOUND", "request_id": "r"}, "retry"),
        (404, {"error": "PENDING", "request_id": "r"}, "retry"),
    ],
)
def test_answers_are_told_apart(status: int, body: object, outcome: str) -> None:
    assert classify(response(status, body))[0] == outcome
