"""The chaos suite's own judgement of a reply, checked without any server (fast, always run)."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_a_slow_turns_timeline_shows_its_partitions_changes_and_the_faults(tmp_path: Path) -> None:
    from agentkernel.pipeline.transport.nats import partition_of
    from tests.chaos.trace import PARTITIONS, NatsTrace, Row, write_timelines

    partition = partition_of("s", PARTITIONS)
    other = (partition + 1) % PARTITIONS
    trace = NatsTrace("http://127.0.0.1:9", tmp_path / "trace.jsonl")
    state = {"delivered": 7, "ack_floor": 6, "num_ack_pending": 1, "num_redelivered": 0}
    trace.rows = [
        Row(101.0, f"IN-p{partition}", {**state, "num_waiting": 3}),
        Row(102.0, f"IN-p{partition}", {**state, "num_waiting": 9}),  # pull requests only
        Row(102.5, f"IN-p{other}", {**state, "num_waiting": 1}),  # another partition
        Row(131.0, f"IN-p{partition}", {**state, "num_redelivered": 1, "num_waiting": 9}),
    ]
    slow = Turn("s", 3, "p3", started=100.5, answered=131.5, status=200)
    quick = Turn("s", 4, "p4", started=131.5, answered=132.0, status=200)
    lost = Turn("s", 5, "p5", started=133.0)
    path = tmp_path / "timelines.txt"
    assert write_timelines(path, [slow, quick, lost], 100.0, [(101.2, "kill -9 runner 1")], trace)
    text = path.read_text()
    assert text.startswith("faults: 1.2s kill -9 runner 1\n")
    assert "s turn 3: sent 0.5s, answered 31.5s (waited 31.0s)" in text
    assert "s turn 5: sent 33.0s, never answered" in text
    assert "s turn 4" not in text
    assert [line.split("s ")[0].strip() for line in text.splitlines() if "IN-p" in line] == [
        "1.00",
        "31.00",
    ]
