"""Benchmark server: the embedded pipeline plus a trivial FastAPI endpoint on the same app.

Run by bench_embedded.py in its own process so client and server do not share a GIL.
"""

from __future__ import annotations

import sys

from fastapi import Request

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config import AKConfig
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.request_handler import parse_chat


async def noop(turn):  # type: ignore[no-untyped-def]
    return "ok"


def main(port: int) -> None:
    registry = AgentRegistry()
    registry.register(Agent("noop", noop))
    config = AKConfig.load()
    config = config.model_copy(update={"api": config.api.model_copy(update={"port": port})})
    handler = IOHandler(config, registry=registry, with_runner=True)

    async def trivial(request: Request) -> dict[str, str]:
        chat = parse_chat(await request.body())  # the same body parsing as the chat route
        return {"result": "ok", "session_id": chat.session_id}

    handler.server.config.app.add_api_route("/bench/trivial", trivial, methods=["POST"])
    handler.serve()


if __name__ == "__main__":
    main(int(sys.argv[1]))
