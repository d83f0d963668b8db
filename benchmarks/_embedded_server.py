"""Benchmark server: the embedded pipeline plus plain FastAPI endpoints on the same app.

Run by bench_embedded.py in its own process so client and server do not share a GIL. Every
setting is the default (``AKConfig.load()`` with no file), as ``agentkernel serve`` runs. Agents:
``noop`` answers at once, ``sleep1`` awaits 1 s. Plain routes: ``POST /bench/trivial`` parses the
same body as the chat route and answers at once; ``POST /bench/sleep`` does the same after
awaiting 1 s.
"""

from __future__ import annotations

import asyncio
import sys

from fastapi import Request

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.http.request_handler import parse_chat
from agentkernel.pipeline.process.io_handler import IOHandler


async def noop(turn):  # type: ignore[no-untyped-def]
    return "ok"


async def sleep1(turn):  # type: ignore[no-untyped-def]
    await asyncio.sleep(1.0)
    return "ok"


def main(port: int) -> None:
    registry = AgentRegistry()
    registry.register(Agent("noop", noop))
    registry.register(Agent("sleep1", sleep1))
    config = AKConfig.load()
    config = config.model_copy(update={"api": config.api.model_copy(update={"port": port})})
    handler = IOHandler(config, registry=registry, with_runner=True)

    async def trivial(request: Request) -> dict[str, str]:
        chat = parse_chat(await request.body())  # the same body parsing as the chat route
        return {"result": "ok", "session_id": chat.session_id}

    async def sleep(request: Request) -> dict[str, str]:
        chat = parse_chat(await request.body())
        await asyncio.sleep(1.0)
        return {"result": "ok", "session_id": chat.session_id}

    app = handler.server.config.app
    app.add_api_route("/bench/trivial", trivial, methods=["POST"])
    app.add_api_route("/bench/sleep", sleep, methods=["POST"])
    handler.serve()


if __name__ == "__main__":
    main(int(sys.argv[1]))
