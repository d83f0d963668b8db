"""The one visibility rule, and a stream that applies it before its first byte."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentkernel.pipeline.response_store.frames import chunk_frame, read_frames
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.wire.records import TurnTicket, visible


@pytest.mark.parametrize(
    ("session", "owner", "to_session", "to_owner", "expected"),
    [
        ("s", None, "s", None, True),
        ("s", None, "s", "bob", True),  # a turn sent without an identity has no owner
        ("s", "alice", "s", "alice", True),
        ("s", "alice", "s", "bob", False),
        ("s", "alice", "s", None, False),
        ("s", "alice", "s2", "alice", False),
        ("s", None, "s ", None, False),
        ("s", "alice", "s", "alice ", False),
    ],
)
def test_visible(
    session: str, owner: str | None, to_session: str, to_owner: str | None, expected: bool
) -> None:
    assert visible(session, owner, to_session, to_owner) is expected


def frames_for(store: InMemoryResponseStore, owner: str | None) -> list[dict[str, Any]]:
    async def first_two() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        frames = read_frames(store, "r1", "s", heartbeat=0.05, idle_timeout=0.2, owner=owner)
        async for frame in frames:
            if frame is not None:
                got.append(frame)
            if len(got) == 2 or (got and got[-1].get("done")):
                break
        return got

    return asyncio.run(asyncio.wait_for(first_two(), 5))


def test_another_identity_gets_no_chunk_of_a_running_turn() -> None:
    store = InMemoryResponseStore()
    store.accept(TurnTicket("r1", "s", "f" * 64, "alice"))
    for index, delta in enumerate(["se", "cret"]):
        store.put_chunk("r1", index, chunk_frame("r1", "s", index, delta))
    assert [f.get("delta") for f in frames_for(store, "alice")] == ["se", "cret"]
    (refused,) = frames_for(store, "bob")
    assert (refused["done"], refused["error"]) == (True, "NOT_FOUND")
    assert "delta" not in refused
