"""The session record's text: what every store keeps, read and written once per turn."""

from __future__ import annotations

import json
import math

import pytest

from agentkernel.core.errors import SessionStateError
from agentkernel.pipeline.session_store.base import (
    REMEMBERED_TURNS,
    SessionRecord,
    TurnOutcome,
)
from agentkernel.pipeline.session_store.index import LOGGED_TURNS, TurnEntry, TurnLog
from agentkernel.pipeline.wire.position import Position


def long_session(turns: int = 120) -> SessionRecord:
    record = SessionRecord(owner="alice")
    for n in range(turns):
        status = 200 if n % 7 else 500
        body = json.dumps({"error": "AGENT_ERROR"} if status == 500 else {"result": f"r{n}"})
        record = record.advance(TurnOutcome(f"req-{n}", status, body), {"n": n}, Position("u", n))
    return record


def earlier_text(record: SessionRecord) -> str:
    """The record as the encoder before this one wrote it (one ``json.dumps`` of it all)."""
    assert record.last is not None
    doc = {
        "format": 2,
        "state": record.state,
        "turns": list(record.committed),
        "last": {
            "request_id": record.last.request_id,
            "status_code": record.last.status_code,
            "body": record.last.body,
        },
    }
    if record.owner is not None:
        doc["owner"] = record.owner
    if record.applied is not None:
        doc["applied"] = record.applied.to_doc()
    doc["log"] = [entry.to_doc() for entry in record.log]
    return json.dumps(doc)


def test_a_long_sessions_record_round_trips() -> None:
    record = long_session()
    again = SessionRecord.decode(record.encode(), record.version)
    assert again == record
    assert len(again.committed) == REMEMBERED_TURNS and len(again.log) == LOGGED_TURNS
    assert [e.request_id for e in again.log] == [f"req-{n}" for n in range(70, 120)]
    assert again.log[-1].error == "AGENT_ERROR" and again.log[-2].error is None  # 119 = 7 x 17


def test_the_text_is_format_2_as_earlier_versions_read_it() -> None:
    record = long_session()
    doc = json.loads(record.encode())
    assert doc["format"] == 2 and doc["state"] == {"n": 119} and doc["owner"] == "alice"
    assert doc["turns"] == list(record.committed)
    # What an earlier version does with the log: one TurnEntry per object, by its keys.
    assert tuple(TurnEntry.from_doc(entry) for entry in doc["log"]) == tuple(record.log)


def test_a_record_written_by_the_earlier_encoder_reads_the_same() -> None:
    record = long_session()
    old = SessionRecord.decode(earlier_text(record), record.version)
    assert old == record
    assert json.loads(old.encode()) == json.loads(earlier_text(record))


@pytest.mark.parametrize(
    "state",
    [
        {"text": "héllo \u2603", "lone": "\ud800", 1: "an int key"},
        {"nan": math.inf, "big": 10**40, "nested": [{"a": [1.5, None, True]}]},
    ],
)
def test_the_state_is_encoded_as_json_dumps_encodes_it(state: dict[str, object]) -> None:
    record = SessionRecord().advance(TurnOutcome("r", 200, "{}"), state)
    stored = json.loads(record.encode())["state"]
    assert stored == json.loads(json.dumps(state))
    assert SessionRecord.decode(record.encode(), 1).state == stored


def test_a_state_json_cannot_carry_is_refused() -> None:
    circular: dict[str, object] = {}
    circular["self"] = circular
    for state in ({"tags": {"a", "b"}}, {"when": object()}, circular):
        with pytest.raises(SessionStateError, match="not JSON-serialisable"):
            SessionRecord(state=state).encode()  # type: ignore[arg-type]


def test_bookkeeping_text_that_utf8_cannot_carry_is_escaped() -> None:
    record = SessionRecord(owner="lone \udc00 owner").advance(TurnOutcome("r", 200, "{}"), {})
    assert SessionRecord.decode(record.encode(), 1).owner == "lone \udc00 owner"


def test_a_malformed_logged_turn_does_not_stop_the_session() -> None:
    text = json.dumps({"format": 2, "state": {}, "turns": ["a"], "last": None, "log": [{"r": "a"}]})
    record = SessionRecord.decode(text, 1)  # its turns go on: the log is not read on that path
    after = SessionRecord.decode(record.advance(TurnOutcome("b", 200, "{}"), {}).encode(), 2)
    assert after.committed == ("a", "b") and len(after.log) == 2
    with pytest.raises(KeyError):  # only showing the log finds it
        list(after.log)


def test_a_log_that_is_not_a_list_of_objects_is_an_unreadable_record() -> None:
    for log in (["a"], "text", [[1, 2]]):
        text = json.dumps({"format": 2, "state": {}, "turns": [], "last": None, "log": log})
        with pytest.raises(TypeError):
            SessionRecord.decode(text, 1)


def test_the_log_is_a_read_only_sequence_of_its_entries() -> None:
    entries = tuple(TurnEntry(f"r{n}", 200, None, 1.5 + n) for n in range(3))
    log = TurnLog.of(entries)
    assert log == entries and log == list(entries) and log != entries[:2]
    assert TurnLog.of(log) is log and hash(log) == hash(entries)
    assert log[1] == entries[1] and log[-2:] == entries[-2:] and next(reversed(log)).at == 3.5
    longer = log.appended(TurnEntry("r3", 500, "AGENT_ERROR", 9.0), limit=3)
    assert [e.request_id for e in longer] == ["r1", "r2", "r3"] and len(log) == 3
    assert SessionRecord(log=entries).encode() == SessionRecord(log=log).encode()


def test_an_erase_finds_the_turns_of_a_log_it_cannot_read_whole() -> None:
    text = json.dumps(
        {
            "format": 2,
            "state": {},
            "turns": [],
            "last": None,
            "log": [{"r": "a", "s": 200, "e": None, "t": 1.0}, {"s": 200}, {"r": 7}, {"r": "b"}],
        }
    )
    log = SessionRecord.decode(text, 1).log
    assert isinstance(log, TurnLog) and log.request_ids() == ["a", "b"]
    assert TurnLog.of((TurnEntry("c", 200, None, 1.0),)).request_ids() == ["c"]
