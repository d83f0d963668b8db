"""Both adapters end to end through the HTTP API (embedded pipeline, real SDKs, fake model).

``triage`` is an OpenAI Agents SDK agent (Responses API), ``helper`` a LangGraph graph with a
LangChain ``ChatOpenAI`` model (Chat Completions API); see ``apps.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentkernel import AgentRegistry
from agentkernel.langgraph import LangGraphModule
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.testing.fake_openai import FakeOpenAI
from tests.adapters.apps import async_helper_graph, register
from tests.api.conftest import Server, make_config

from .conftest import answer, ask, new_session, stream

ADAPTERS = [("triage", "[Triage]"), ("helper", "[Helper]")]


def test_openai_handoff_and_tool_then_memory_sync_and_async(server: Server) -> None:
    c, s = server.client, new_session()
    assert answer(ask(c, s, "triage", "hello")) == (
        "[Triage] You said: hello. (1 messages from you so far.)"
    )
    second = answer(ask(c, s, "triage", "transfer_to_billing then add 2 and 3"))
    assert second.startswith("[Billing agent] You said: transfer_to_billing then add 2 and 3.")
    assert "Before that you said: hello." in second
    assert "transfer_to_billing returned" in second and "add returned 5." in second
    third = answer(ask(c, s, "triage", "what did I ask?", asynchronous=True))
    assert third == (
        "[Triage] You said: what did I ask?. Before that you said: transfer_to_billing then add "
        "2 and 3. (3 messages from you so far.)"
    )


def test_langgraph_tool_then_memory_sync_and_async(server: Server) -> None:
    c, s = server.client, new_session()
    assert answer(ask(c, s, "helper", "hello")) == (
        "[Helper] You said: hello. (1 messages from you so far.)"
    )
    second = answer(ask(c, s, "helper", "lookup Paris", asynchronous=True))
    assert second == (
        "[Helper] You said: lookup Paris. Before that you said: hello. "
        "(2 messages from you so far.) lookup returned sunny in Paris."
    )
    assert "Before that you said: lookup Paris." in answer(ask(c, s, "helper", "and?"))


def test_sessions_do_not_share_a_conversation(server: Server) -> None:
    c = server.client
    for agent, _ in ADAPTERS:
        one, two = new_session(), new_session()
        ask(c, one, agent, "secret")
        assert "(1 messages" in answer(ask(c, two, agent, "hi"))


@pytest.mark.parametrize(("agent", "persona"), ADAPTERS)
def test_sse_streams_deltas_and_the_stream_is_remembered(
    server: Server, agent: str, persona: str
) -> None:
    c, s = server.client, new_session()
    answer(ask(c, s, agent, "my name is Ada"))
    frames = stream(c, s, agent, "who am I")
    chunks, done = [f for f in frames if not f.get("done")], frames[-1]
    expected = f"{persona} You said: who am I. Before that you said: my name is Ada."
    assert len(chunks) > 5  # word by word, not one block
    assert "".join(f["delta"] for f in chunks) == done["result"]
    assert done["result"].startswith(expected)
    assert "(3 messages" in answer(ask(c, s, agent, "again"))


@pytest.mark.parametrize(("agent", "persona"), ADAPTERS)
def test_a_rate_limit_is_retried_by_the_pipeline(
    server: Server, model: FakeOpenAI, agent: str, persona: str
) -> None:
    c, s = server.client, new_session()
    model.fail("rate_limit", times=1)
    assert answer(ask(c, s, agent, "hi")).startswith(f"{persona} You said: hi.")
    assert len(model.requests) == 2  # the 429, then the second delivery of the turn


@pytest.mark.parametrize(("agent", "persona"), ADAPTERS)
def test_rate_limited_every_time_ends_in_turn_failed_and_the_session_goes_on(
    server: Server, model: FakeOpenAI, agent: str, persona: str
) -> None:
    c, s = server.client, new_session()
    answer(ask(c, s, agent, "first"))
    failed = ask(c, s, agent, "busy [fake:rate_limit]")
    assert (failed.status_code, failed.json()["error"]) == (500, "TURN_FAILED")
    assert len(model.requests) == 1 + 2  # max_receive_count deliveries of the failing turn
    after = answer(ask(c, s, agent, "after"))
    assert "Before that you said: first. (2 messages" in after  # the failed turn left no trace


@pytest.mark.parametrize(("agent", "persona"), ADAPTERS)
def test_a_model_that_never_answers_is_cut_off_by_the_turn_timeout(
    server: Server, agent: str, persona: str
) -> None:
    c, s = server.client, new_session()
    started = time.monotonic()
    failed = ask(c, s, agent, "think hard [fake:slow]")
    assert (failed.status_code, failed.json()["error"]) == (500, "TURN_FAILED")
    assert time.monotonic() - started < 15  # two deliveries of 1.5 s, not the model's 20 s
    assert answer(ask(c, s, agent, "still there?")).startswith(f"{persona} You said: still")


@pytest.mark.parametrize(("agent", "persona"), ADAPTERS)
@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("bad_request", "ModelError: the model provider refused the request (HTTP 400)"),
        ("malformed", "ModelError: the model's response is malformed: JSONDecodeError"),
    ],
)
def test_refused_and_malformed_answers_are_clear_errors_not_retried(
    server: Server, model: FakeOpenAI, agent: str, persona: str, marker: str, message: str
) -> None:
    c, s = server.client, new_session()
    failed = ask(c, s, agent, f"x [fake:{marker}]")
    assert (failed.status_code, failed.json()["error"]) == (500, "AGENT_ERROR")
    assert message in failed.json()["message"]
    assert len(model.requests) == 1
    frames = stream(c, s, agent, f"y [fake:{marker}]")
    assert (frames[-1]["done"], frames[-1]["error"]) == (True, "AGENT_ERROR")
    assert message in frames[-1]["message"]
    assert "(1 messages" in answer(ask(c, s, agent, "ok"))


@pytest.fixture
def cancel_server(model: FakeOpenAI) -> Iterator[Server]:
    """The OpenAI agents, and a LangGraph graph whose model node is async."""
    registry = register(AgentRegistry())
    LangGraphModule([async_helper_graph()], registry=registry)
    server = Server(IOHandler(make_config(), registry=registry, with_runner=True))
    yield server
    server.close()


@pytest.mark.parametrize("agent", ["triage", "helper_async"])
def test_a_cancel_aborts_the_model_call(
    cancel_server: Server, model: FakeOpenAI, agent: str
) -> None:
    c, s = cancel_server.client, new_session()
    body = {"session_id": s, "prompt": "think hard [fake:slow]", "agent": agent}
    posted = c.post("/api/v1/chat", json=body, headers={"Prefer": "respond-async"})
    rid = posted.json()["request_id"]
    deadline = time.monotonic() + 10
    while not model.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert model.requests, "the model was never called"
    sent = time.time()
    cancelled = c.post(f"/api/v1/chat/{s}/cancel", params={"request_id": rid})
    assert cancelled.status_code == 200, cancelled.text
    deadline = time.monotonic() + 3
    while not model.abandoned and time.monotonic() < deadline:
        time.sleep(0.01)
    assert model.abandoned, "the model call went on after the cancel"
    assert model.abandoned[0] - sent < 1.5
    assert len(model.requests) == 1  # not retried
    assert "You said: still" in answer(ask(c, s, agent, "still there?"))
