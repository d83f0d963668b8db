"""Warm Lambda containers: many invocations of one handler in a row, as API Gateway and the SQS
event source mapping make them, with an OpenAI Agents SDK agent on the fake model server.

The SDK keeps its HTTP client (and its pooled connections) across turns; a handler that ran
each invocation on a fresh event loop failed every second turn with ``Event loop is closed``.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no trace export: no network here

from agents import Agent as OpenAIAgent
from agents import OpenAIResponsesModel
from openai import AsyncOpenAI

from agentkernel import AgentRegistry
from agentkernel.aws import (
    Lambda,
    ResponseHandler,
    ServerlessAgentRunner,
    ServerlessStreamAgentRunner,
    WebsocketConnectionHandler,
    container_loop,
)
from agentkernel.openai import OpenAIModule
from agentkernel.testing.fake_openai import FakeOpenAI
from tests.aws.lambda_harness import LambdaContext, http_v2, pump, settle, sqs_event, websocket
from tests.aws.test_lambda import Deployment

pytestmark = pytest.mark.aws

WARM_INVOCATIONS = 8
HANDLERS = (Lambda, ServerlessAgentRunner, ResponseHandler, WebsocketConnectionHandler)


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        yield server


@pytest.fixture
def d(aws: str, model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    for cls in HANDLERS:
        cls.reset()
    AgentRegistry.reset()
    # One model client for the container's life, as the SDK's default client is (this test's
    # own, so that no other test's loop has touched it); OPENAI_BASE_URL names the fake server.
    client = AsyncOpenAI()
    model = OpenAIResponsesModel(model="fake-model", openai_client=client)
    assistant = OpenAIAgent(
        name="assistant", instructions="Assistant. Answer briefly.", model=model
    )
    OpenAIModule([assistant])
    deployment = Deployment(monkeypatch)
    yield deployment
    container_loop.run_in_container(client.close())
    deployment.management.close()
    for cls in HANDLERS:
        cls.reset()
    AgentRegistry.reset()


def body_of(response: dict[str, Any]) -> Any:
    return json.loads(response["body"])


def post_async(session: str, prompt: str) -> str:
    chat = {"session_id": session, "prompt": prompt, "agent": "assistant"}
    event = http_v2("POST", "/api/v1/chat", chat, headers={"prefer": "respond-async"})
    accepted = Lambda.handler(event, LambdaContext())
    assert accepted["statusCode"] == 202, accepted
    return str(body_of(accepted)["request_id"])


def invoke(d: Deployment, runner: Any) -> None:
    """One warm invocation of the runner function with the turn just queued; it must succeed."""
    event = sqs_event(d.input)
    assert len(event["Records"]) == 1
    result = runner(event, LambdaContext())
    settle(d.input, event, result)  # the mapping deletes the record, freeing its session
    assert result == {"batchItemFailures": []}


async def running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_every_handler_runs_on_the_one_loop_of_the_container_until_it_is_reset() -> None:
    container_loop.reset()
    first = container_loop.run_in_container(running_loop())
    assert container_loop.run_in_container(running_loop()) is first
    from_threads: list[asyncio.AbstractEventLoop] = []
    threads = [
        threading.Thread(
            target=lambda: from_threads.append(container_loop.run_in_container(running_loop()))
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert from_threads == [first] * 3
    container_loop.reset()
    assert first.is_closed()
    assert container_loop.run_in_container(running_loop()) is not first


@pytest.mark.parametrize("runner", [ServerlessAgentRunner, ServerlessStreamAgentRunner])
def test_every_warm_invocation_of_an_openai_agent_succeeds(
    d: Deployment, model: FakeOpenAI, runner: type[ServerlessAgentRunner]
) -> None:
    session = f"warm-{uuid.uuid4().hex[:8]}"
    for n in range(1, WARM_INVOCATIONS + 1):
        request_id = post_async(session, f"turn {n}")
        invoke(d, runner.handle)
        pump(d.output, ResponseHandler.handle, rounds=2)
        got = Lambda.handler(
            http_v2("GET", f"/api/v1/chat/{session}", query={"request_id": request_id})
        )
        assert got["statusCode"] == 200, f"invocation {n}: {got['body']}"
        # The conversation is carried from turn to turn: the model saw every earlier prompt.
        assert f"You said: turn {n}." in body_of(got)["result"]
        assert f"({n} messages from you so far.)" in body_of(got)["result"]
    assert len(model.requests) == WARM_INVOCATIONS


def test_every_warm_streamed_websocket_turn_reaches_its_connection(
    d: Deployment, model: FakeOpenAI
) -> None:
    WebsocketConnectionHandler.handler(websocket("CONNECT", "warm-conn"))
    seen = 0
    for n in range(1, WARM_INVOCATIONS + 1):
        chat = {"session_id": "warm-ws", "prompt": f"turn {n}", "agent": "assistant"}
        Lambda.handler(websocket("MESSAGE", "warm-conn", {"route": "chat", "body": chat}))
        invoke(d, ServerlessStreamAgentRunner.handle)
        while not (frames := d.management.frames.get("warm-conn", []))[seen:] or not frames[-1].get(
            "done"
        ):
            assert pump(d.output, ResponseHandler.handle), f"invocation {n}: no reply queued"
        done = frames[-1]
        assert done.get("error") is None, f"invocation {n}: {done}"
        assert f"You said: turn {n}." in done["result"]
        seen = len(frames)


# -- one container: a process of its own, the upstream user's runner file as written ------------

RUNNER_FILE = """
from agents import Agent

from agentkernel.aws import ServerlessAgentRunner
from agentkernel.openai import OpenAIModule

assistant = Agent(name="assistant", instructions="Assistant. Answer briefly.")
OpenAIModule([assistant])

handler = ServerlessAgentRunner.handle
"""

#: The Lambda runtime in miniature: one event per line in, the handler's answer per line out.
RUNTIME = """
import json, sys
sys.path.insert(0, sys.argv[1])
from agent_runner import handler
for line in sys.stdin:
    print(json.dumps(handler(json.loads(line), None)), flush=True)
"""


class Container:
    """A warm Lambda container running ``agent_runner.handler``, invoked again and again."""

    def __init__(self, directory: Path) -> None:
        (directory / "agent_runner.py").write_text(RUNNER_FILE)
        self.process = subprocess.Popen(
            [sys.executable, "-c", RUNTIME, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def invoke(self, event: dict[str, Any], timeout: float = 60) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(event) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, "the container did not answer in time"
        return json.loads(self.process.stdout.readline())

    def stop(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        try:
            self.process.wait(30)
        finally:
            self.process.kill()  # a no-op once it has ended
            self.process.stdout.close()


def test_a_warm_container_running_the_upstream_runner_file_answers_every_turn(
    d: Deployment, tmp_path: Path
) -> None:
    """The SDK's own default client, shared by every run of the process, as users deploy it."""
    container = Container(tmp_path)
    try:
        for n in range(1, WARM_INVOCATIONS + 1):
            request_id = post_async("container", f"turn {n}")
            event = sqs_event(d.input)
            result = container.invoke(event)
            settle(d.input, event, result)
            assert result == {"batchItemFailures": []}
            pump(d.output, ResponseHandler.handle)
            got = Lambda.handler(
                http_v2("GET", "/api/v1/chat/container", query={"request_id": request_id})
            )
            assert got["statusCode"] == 200, f"invocation {n}: {got['body']}"
            assert f"({n} messages from you so far.)" in body_of(got)["result"]
    finally:
        container.stop()
