"""The LangGraph example file registers a graph that runs against an OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import runpy
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkernel import AgentRegistry, Turn
from agentkernel.testing.fake_openai import FakeOpenAI

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langgraph_agent.py"


@pytest.fixture
def default_registry() -> Iterator[AgentRegistry]:
    AgentRegistry.reset()
    yield AgentRegistry.default()
    AgentRegistry.reset()


def test_the_langgraph_example_remembers_and_uses_its_tool(
    model: FakeOpenAI, default_registry: AgentRegistry
) -> None:
    runpy.run_path(str(EXAMPLE), run_name="__agentkernel_agents__")
    writer = default_registry.get("writer")
    state: dict[str, object] = {}
    first = asyncio.run(writer.run(Turn("hello", "s", "r1", "writer", state=state)))
    assert first == "[Writer] You said: hello. (1 messages from you so far.)"
    second = asyncio.run(
        writer.run(Turn("word_count of these 4 words", "s", "r2", "writer", state))
    )
    assert "Before that you said: hello." in second and "word_count returned 4." in second
