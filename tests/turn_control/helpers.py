"""Agents whose turns can be watched while they run, and the requests the tests send."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

import httpx
from tests.api.conftest import poll

from agentkernel import Agent, AgentRegistry


class Watch:
    """What the test agents saw: turns started, ran to their end, or saw a cancellation."""

    def __init__(self) -> None:
        self.started: dict[str, threading.Event] = {}
        self.finished: set[str] = set()
        self.cancelled: set[str] = set()
        self.runs: dict[str, int] = {}
        self.states: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def begin(self, prompt: str, state: dict[str, Any]) -> None:
        with self.lock:
            self.runs[prompt] = self.runs.get(prompt, 0) + 1
            self.states[prompt] = copy.deepcopy(state)
            self.started.setdefault(prompt, threading.Event()).set()

    def wait_started(self, prompt: str, timeout: float = 10) -> None:
        with self.lock:
            event = self.started.setdefault(prompt, threading.Event())
        assert event.wait(timeout), f"turn {prompt!r} did not start"


WATCH = Watch()


async def long(turn):  # type: ignore[no-untyped-def]
    """Writes its prompt into the state at once, then works for ``seconds``."""
    WATCH.begin(turn.prompt, turn.state)
    turn.state.setdefault("prompts", []).append(turn.prompt)
    try:
        await asyncio.sleep(float(turn.extra.get("seconds", 30)))
    except asyncio.CancelledError:
        WATCH.cancelled.add(turn.prompt)
        raise
    WATCH.finished.add(turn.prompt)
    return f"done {turn.prompt}"


def sync_long(turn):  # type: ignore[no-untyped-def]
    """A sync agent: works in small steps and returns early once told it is cancelled."""
    WATCH.begin(turn.prompt, turn.state)
    deadline = time.monotonic() + float(turn.extra.get("seconds", 30))
    while time.monotonic() < deadline:
        if turn.cancelled:
            WATCH.cancelled.add(turn.prompt)
            return "stopped early"
        time.sleep(0.01)
    WATCH.finished.add(turn.prompt)
    return f"done {turn.prompt}"


async def streaming(turn):  # type: ignore[no-untyped-def]
    WATCH.begin(turn.prompt, turn.state)
    for index in range(10_000):
        yield f"w{index} "
        await asyncio.sleep(0.05)


def registry() -> AgentRegistry:
    reg = AgentRegistry()
    for name, fn in (("long", long), ("sync_long", sync_long), ("streaming", streaming)):
        reg.register(Agent(name, fn, f"{name} test agent"))
    return reg


def post_async(client: httpx.Client, session: str, prompt: str, **extra: Any) -> str:
    """Enqueue a turn without waiting; its request id."""
    body = {"session_id": session, "prompt": prompt, **extra}
    response = client.post("/api/v1/chat", json=body, headers={"Prefer": "respond-async"})
    assert response.status_code == 202, response.text
    return str(response.json()["request_id"])


def cancel(client: httpx.Client, session: str, request_id: str) -> httpx.Response:
    return client.post(f"/api/v1/chat/{session}/cancel", params={"request_id": request_id})


def reply(
    client: httpx.Client, session: str, request_id: str, timeout: float = 15
) -> httpx.Response:
    """The turn's final reply, polled until it is there."""
    return poll(client, session, request_id, timeout)
