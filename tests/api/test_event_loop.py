"""The server runs on asyncio's own event loop, even where uvloop is installed (uvicorn's
``loop="auto"`` would pick it): uvloop's loop refused to close at shutdown, which failed the
HTTP thread and so the process."""

from __future__ import annotations

import asyncio

import pytest

from agentkernel import Agent, AgentRegistry
from agentkernel.pipeline.process.io_handler import IOHandler

from .conftest import Server, make_config


async def which_loop(turn):  # type: ignore[no-untyped-def]
    return type(asyncio.get_running_loop()).__module__


def test_the_server_runs_and_stops_on_asyncios_loop_with_uvloop_installed() -> None:
    pytest.importorskip("uvloop")  # a test dependency: installed wherever the suite runs
    registry = AgentRegistry()
    registry.register(Agent("which_loop", which_loop))
    handler = IOHandler(make_config(), registry=registry, with_runner=True)
    server = Server(handler)
    try:
        reply = server.client.post("/api/v1/chat", json={"session_id": "s", "prompt": "x"})
        assert reply.json()["result"].startswith("asyncio")
    finally:
        server.close()  # asserts the server thread ended
    assert handler._http_done.is_set()
