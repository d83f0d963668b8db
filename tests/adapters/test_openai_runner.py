"""``OpenAIModule(agents, runner=...)``: a runner subclass wraps every run of a module's agents,
plain and streamed, through the HTTP API of the embedded pipeline (real SDK, fake model)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from agents import Agent, OpenAIResponsesModel
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from agentkernel import AgentRegistry, Turn
from agentkernel.openai import OpenAIAgent, OpenAIModule, OpenAIRunner
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.testing.fake_openai import FakeOpenAI
from tests.api.conftest import Server, make_config

from .conftest import answer, ask, new_session, stream


class TracedRunner(OpenAIRunner):
    """What a tracing runner does: a span around each run, here a record of it."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str]] = []

    async def run(self, agent: OpenAIAgent, turn: Turn) -> str:
        self.spans.append(("run", agent.name, turn.session_id))
        return "[traced] " + await super().run(agent, turn)

    async def stream(self, agent: OpenAIAgent, turn: Turn) -> AsyncIterator[str]:
        self.spans.append(("stream", agent.name, turn.session_id))
        async for delta in super().stream(agent, turn):
            yield delta.upper()


def sdk_agents() -> list[Agent[Any]]:
    # A client of the test's own: the SDK's process-wide default one would outlive the test's
    # event loop (see tests/aws/test_lambda_warm.py).
    # No kept-alive connections: the client is never closed (its loop ends with the server), so
    # a pooled socket would be collected unclosed during a later test (a ResourceWarning).
    no_pool = DefaultAsyncHttpxClient(limits=httpx.Limits(max_keepalive_connections=0))
    client = AsyncOpenAI(http_client=no_pool)
    model = OpenAIResponsesModel(model="fake-model", openai_client=client)
    billing = Agent(name="billing", instructions="Billing agent. Invoices.", model=model)
    triage = Agent(name="triage", instructions="Triage. Route.", handoffs=[billing], model=model)
    return [triage, billing]


@pytest.fixture
def traced(model: FakeOpenAI) -> Iterator[tuple[Server, TracedRunner]]:
    registry, runner = AgentRegistry(), TracedRunner()
    OpenAIModule(sdk_agents(), runner=runner, registry=registry)
    server = Server(IOHandler(make_config(), registry=registry, with_runner=True))
    yield server, runner
    server.close()


def test_the_modules_runner_wraps_every_plain_and_streamed_run(
    traced: tuple[Server, TracedRunner],
) -> None:
    server, runner = traced
    session = new_session()
    assert answer(ask(server.client, session, "triage", "hello")) == (
        "[traced] [Triage] You said: hello. (1 messages from you so far.)"
    )
    frames = stream(server.client, session, "billing", "and now")
    deltas = "".join(f["delta"] for f in frames if "delta" in f)
    assert deltas.startswith("[BILLING AGENT] YOU SAID: AND NOW. BEFORE THAT YOU SAID: HELLO.")
    assert runner.spans == [("run", "triage", session), ("stream", "billing", session)]


def test_the_runner_is_shared_by_the_modules_agents_and_may_be_positional(
    model: FakeOpenAI,
) -> None:
    registry, runner = AgentRegistry(), TracedRunner()
    OpenAIModule(sdk_agents(), runner, registry=registry)
    assert {registry.get(name).runner for name in ("triage", "billing")} == {runner}  # type: ignore[attr-defined]
    plain = AgentRegistry()
    OpenAIModule(sdk_agents(), registry=plain)
    assert type(plain.get("triage").runner) is OpenAIRunner  # type: ignore[attr-defined]


@pytest.mark.parametrize("runner", [object(), "OpenAIRunner", OpenAIRunner])
def test_a_runner_that_is_not_an_openai_runner_is_refused(model: FakeOpenAI, runner: Any) -> None:
    registry = AgentRegistry()
    with pytest.raises(TypeError, match="OpenAIRunner"):
        OpenAIModule(sdk_agents(), runner=runner, registry=registry)
    assert registry.agents() == []


class UpstreamShapedRunner(OpenAIRunner):
    """A subclass written to upstream's signature: refused when the module is built."""

    async def run(self, agent: Any, session: Any, requests: Any) -> Any:  # type: ignore[override]
        return await super().run(agent, session)


def test_a_runner_written_to_upstreams_signature_is_refused_with_the_way_to_rewrite_it(
    model: FakeOpenAI,
) -> None:
    registry = AgentRegistry()
    with pytest.raises(TypeError, match=r"UpstreamShapedRunner.run must take \(agent, turn\)"):
        OpenAIModule(sdk_agents(), runner=UpstreamShapedRunner(), registry=registry)
    assert registry.agents() == []
