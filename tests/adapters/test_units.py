"""The adapters' pieces on their own: the SDK session, the checkpointer, error mapping, imports."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from agentkernel import AgentRegistry, RetryableError, Turn
from agentkernel.core.model_errors import ModelError, model_failure
from agentkernel.langgraph import CHECKPOINT_KEY, LangGraphModule, last_message_text
from agentkernel.openai import TurnSession


def items(*roles: str) -> list[dict[str, Any]]:
    return [
        {"role": r, "content": str(i)} if r else {"type": "x", "n": i} for i, r in enumerate(roles)
    ]


def test_the_session_keeps_the_latest_items_from_a_user_message_on() -> None:
    kept = items("user", "assistant", "user", "", "", "assistant")
    session = TurnSession("s", kept, max_items=3)
    asyncio.run(session.add_items([{"role": "user", "content": "new"}]))
    assert [i.get("role") for i in kept] == ["user"]  # cut at the newest user message
    kept[:] = items("user", "", "", "", "")
    asyncio.run(session.add_items([{"type": "x"}]))
    assert len(kept) == 6 and kept[0]["role"] == "user"  # one exchange is never split
    assert asyncio.run(session.get_items(limit=2)) == kept[-2:]


def test_the_session_stores_items_as_json() -> None:
    session = TurnSession("s", [])
    with pytest.raises(TypeError):
        asyncio.run(session.add_items([{"role": "user", "content": object()}]))


def echo_graph() -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        said = [m.content for m in state["messages"] if m.type == "human"]
        return {"messages": [AIMessage(" | ".join(str(s) for s in said))]}

    return (
        StateGraph(MessagesState)
        .add_node("reply", reply)
        .add_edge(START, "reply")
        .compile(name="echo")
    )


def run_turns(agent_name: str, registry: AgentRegistry, prompts: list[str]) -> list[str]:
    """Run turns as the Agent Runner does: the state goes through JSON between turns."""
    state: dict[str, Any] = {}
    replies = []
    for n, prompt in enumerate(prompts):
        turn = Turn(prompt, "s1", f"r{n}", agent_name, state=json.loads(json.dumps(state)))
        replies.append(asyncio.run(registry.get(agent_name).run(turn)))
        state = turn.state
    return replies


def test_the_checkpointer_keeps_one_checkpoint_and_the_thread_resumes_from_json() -> None:
    registry = AgentRegistry()
    LangGraphModule([echo_graph()], registry=registry)
    assert run_turns("echo", registry, ["a", "b", "c"]) == ["a", "a | b", "a | b | c"]
    state: dict[str, Any] = {}
    turn = Turn("a", "s1", "r0", "echo", state=state)
    asyncio.run(registry.get("echo").run(turn))
    assert list(state[CHECKPOINT_KEY]) == [""]  # the latest checkpoint of the root namespace


def test_an_interrupt_is_resumed_by_the_next_turn() -> None:
    def ask_first(state: MessagesState) -> dict[str, Any]:
        approved = interrupt("approve?")
        return {"messages": [AIMessage(f"approved={approved}")]}

    graph = StateGraph(MessagesState).add_node("ask", ask_first).add_edge(START, "ask")

    def make_input(turn: Turn) -> Any:
        if turn.prompt.startswith("resume:"):
            return Command(resume=turn.prompt.removeprefix("resume:"))
        return {"messages": [{"role": "user", "content": turn.prompt}]}

    def read_output(output: Any) -> str:
        if "__interrupt__" in output:
            return f"waiting: {output['__interrupt__'][0].value}"
        return last_message_text(output)

    registry = AgentRegistry()
    LangGraphModule(
        {"approval": graph.compile()}, registry=registry, make_input=make_input,
        read_output=read_output,
    )  # fmt: skip
    assert run_turns("approval", registry, ["pay", "resume:yes"]) == [
        "waiting: approve?",
        "approved=yes",
    ]


class StatusError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"Error code: {status_code}")
        self.status_code = status_code


class APITimeoutError(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (StatusError(429), RetryableError),
        (StatusError(503), RetryableError),
        (StatusError(400), ModelError),
        (StatusError(401), ModelError),
        (APITimeoutError("read timed out"), RetryableError),
        (json.JSONDecodeError("Expecting value", "{", 1), ModelError),
        (ValueError("a bug in a tool"), type(None)),
    ],
)
def test_model_failures_are_mapped_by_status_and_kind(exc: Exception, expected: type) -> None:
    assert type(model_failure(exc)) is expected


def test_a_wrapped_provider_error_is_found_in_the_cause_chain() -> None:
    try:
        try:
            raise StatusError(429)
        except StatusError as inner:
            raise RuntimeError("the framework failed") from inner
    except RuntimeError as outer:
        assert isinstance(model_failure(outer), RetryableError)


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_fake_model_server_imports_no_agent_sdk() -> None:
    loaded = run(
        "import sys, agentkernel.testing.fake_openai\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'agents', 'openai', 'langgraph', 'langchain_core', 'langchain_openai'}))"
    )
    assert loaded == "[]"


@pytest.mark.parametrize(("module", "blocked"), [("openai", "agents"), ("langgraph", "langgraph")])
def test_a_missing_sdk_names_the_extra(module: str, blocked: str) -> None:
    message = run(
        f"import sys\nsys.modules[{blocked!r}] = None\n"
        f"try:\n    import agentkernel.{module}\nexcept ImportError as exc:\n    print(exc)\n"
    )
    assert message == (
        f"agentkernel.{module} requires the '{module}' extra: pip install 'agentkernel[{module}]'"
    )


def test_the_core_imports_no_agent_sdk_even_when_installed() -> None:
    loaded = run(
        "import sys, agentkernel, agentkernel.pipeline.runner.agent_runner, "
        "agentkernel.cli.commands, "
        "agentkernel.core.model_errors\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'agents', 'openai', 'langgraph', 'langchain_core', 'langchain_openai'}))"
    )
    assert loaded == "[]"
