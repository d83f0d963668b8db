"""A fake OpenAI model server per test, and the embedded pipeline running the adapter agents."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no trace export: no network here

from agentkernel import AgentRegistry
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.testing.fake_openai import FakeOpenAI
from tests.adapters.apps import register
from tests.api.conftest import Server, make_config, poll

SSE = {"Accept": "text/event-stream"}


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    with FakeOpenAI(slow_seconds=20) as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        yield server


@pytest.fixture
def server(model: FakeOpenAI) -> Iterator[Server]:
    server = Server(IOHandler(make_config(), registry=register(AgentRegistry()), with_runner=True))
    yield server
    server.close()


def new_session() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def ask(
    client: httpx.Client, session: str, agent: str, prompt: str, asynchronous: bool = False
) -> httpx.Response:
    """One turn, answered synchronously or by polling after a 202."""
    body = {"session_id": session, "agent": agent, "prompt": prompt}
    if not asynchronous:
        return client.post("/api/v1/chat", json=body)
    accepted = client.post("/api/v1/chat", json=body, headers={"Prefer": "respond-async"})
    assert accepted.status_code == 202, accepted.text
    return poll(client, session, accepted.json()["request_id"], timeout=20)


def answer(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["result"])


def stream(client: httpx.Client, session: str, agent: str, prompt: str) -> list[dict[str, Any]]:
    """The frames of one turn streamed over Server-Sent Events."""
    body = {"session_id": session, "agent": agent, "prompt": prompt}
    with client.stream("POST", "/api/v1/chat", json=body, headers=SSE) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data:")]
