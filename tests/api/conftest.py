"""A real uvicorn server running the embedded pipeline, with agents built for the tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from agentkernel import Agent, AgentRegistry, RetryableError
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.transport.base import QueueTransport

ATTEMPTS: dict[str, int] = {}


async def echo(turn):  # type: ignore[no-untyped-def]
    await asyncio.sleep(float(turn.extra.get("delay", 0)))
    turn.state.setdefault("prompts", []).append(turn.prompt)
    return f"{turn.prompt} #{len(turn.state['prompts'])}"


async def slow(turn):  # type: ignore[no-untyped-def]
    await asyncio.sleep(float(turn.extra.get("seconds", 0.5)))
    return "slept"


def broken(turn):  # type: ignore[no-untyped-def]
    raise ValueError("the model said no")


async def flaky(turn):  # type: ignore[no-untyped-def]
    ATTEMPTS[turn.request_id] = turn.attempt
    raise RetryableError("rate limited")


async def once(turn):  # type: ignore[no-untyped-def]
    """Refuses its first delivery with a RetryableError, then streams its answer."""
    if turn.attempt == 1:
        raise RetryableError("rate limited, once")
    yield "answered "
    yield "late"


async def trace(turn):  # type: ignore[no-untyped-def]
    return turn.traceparent


async def words(turn):  # type: ignore[no-untyped-def]
    for word in turn.prompt.split():
        yield word + " "


def registry() -> AgentRegistry:
    reg = AgentRegistry()
    for name, fn in (
        ("echo", echo),
        ("slow", slow),
        ("broken", broken),
        ("flaky", flaky),
        ("once", once),
        ("words", words),
        ("trace", trace),
    ):
        reg.register(Agent(name, fn, f"{name} test agent"))
    return reg


class Server:
    def __init__(self, handler: IOHandler) -> None:
        self.handler = handler
        self.thread = threading.Thread(target=handler.serve, kwargs={"exit_on_shutdown": False})
        self.thread.start()
        self.url = f"http://127.0.0.1:{handler.wait_started()}"
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def close(self) -> None:
        self.client.close()
        self.handler.stop()
        self.thread.join(15)
        assert not self.thread.is_alive(), "server did not stop"


def make_config(**api: Any) -> AKConfig:
    config = AKConfig.load()
    return config.model_copy(
        update={
            "api": config.api.model_copy(update={"port": 0, **api}),
            "execution": config.execution.model_copy(
                update={
                    "queues": config.execution.queues.model_copy(
                        update={
                            "input": config.execution.queues.input.model_copy(
                                update={"max_receive_count": 2}
                            )
                        }
                    )
                }
            ),
        }
    )


@pytest.fixture
def start_server() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []
    METRICS.reset()

    def start(
        transport: QueueTransport | None = None,
        mode: str | None = None,
        store: ResponseStore | None = None,
        prepare: Callable[[IOHandler], None] | None = None,
        **api: Any,
    ) -> Server:
        """``prepare`` gets the handler before it serves (to add middleware, or wrap the app)."""
        config = make_config(**api)
        if mode:
            config = config.model_copy(
                update={"execution": config.execution.model_copy(update={"mode": mode})}
            )
        handler = IOHandler(
            config, registry=registry(), transport=transport, store=store, with_runner=True
        )
        if prepare is not None:
            prepare(handler)
        server = Server(handler)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def server(start_server: Callable[..., Server]) -> Server:
    return start_server()


def poll(
    client: httpx.Client, session: str, request_id: str, timeout: float = 10
) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"/api/v1/chat/{session}", params={"request_id": request_id})
        if response.status_code != 404 or time.monotonic() > deadline:
            return response
        time.sleep(0.02)
