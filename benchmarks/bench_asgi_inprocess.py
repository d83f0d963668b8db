"""CPU per no-op turn of the embedded app, driven in-process: the pipeline without an HTTP server.

``bench_embedded.py`` measures turns over HTTP, where uvicorn's own work is most of the trivial
route's cost and part of every turn's. This calls the app as an ASGI callable on one event loop
(the embedded defaults: in-memory queues, stores and the runner on the same loop), 32 callers at
once, each turn in a new session, so what it reports is the pipeline's work and FastAPI's, not
the server's. Both paths are measured in the same process, alternating, with the server's garbage
collector settings (``tune_for_server``).

Usage: python benchmarks/bench_asgi_inprocess.py [--turns 3000] [--rounds 5]

To see where a turn's CPU goes, run it under a sampling profiler, for instance
``py-spy record -r 2000 -f raw -o chat.txt -- python benchmarks/bench_asgi_inprocess.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from fastapi import Request

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config import AKConfig
from agentkernel.pipeline.consumer.in_loop import InLoopConsumer
from agentkernel.pipeline.process.collector import tune_for_server
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.request_handler import parse_chat

CALLERS = 32
ROUTES = {"pipeline": "/api/v1/chat", "trivial": "/bench/trivial"}


async def noop(turn):  # type: ignore[no-untyped-def]
    return "ok"


def build() -> tuple[IOHandler, Any]:
    """The embedded IO handler with its runner, and its app with the trivial route added."""
    registry = AgentRegistry()
    registry.register(Agent("noop", noop))
    handler = IOHandler(AKConfig.load(), registry=registry, with_runner=True)
    app = handler.server.config.app

    async def trivial(request: Request) -> dict[str, str]:
        chat = parse_chat(await request.body())  # the same body parsing as the chat route
        return {"result": "ok", "session_id": chat.session_id}

    app.add_api_route("/bench/trivial", trivial, methods=["POST"])
    return handler, app


def start(handler: IOHandler) -> None:
    """On the running event loop: start the handler's in-loop consumers (INPUT and OUTPUT)."""
    for consumer in (handler.output_loop, handler.runner_loop):
        assert isinstance(consumer, InLoopConsumer), "the embedded defaults consume in-loop"
        consumer.start()


async def post(app: Any, path: str, body: bytes) -> int:
    """One POST through the ASGI app; returns the status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"bench"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def run(app: Any, path: str, turns: int, tag: str) -> None:
    """``turns`` requests from ``CALLERS`` callers, each in a session of its own."""
    numbers = iter(range(turns))

    async def caller() -> None:
        for n in numbers:
            chat = {"agent": "noop", "session_id": f"{tag}-{n}", "prompt": "hi"}
            status = await post(app, path, json.dumps(chat).encode())
            if status != 200:
                raise RuntimeError(f"{path} answered {status}")

    await asyncio.gather(*(caller() for _ in range(CALLERS)))


async def main(turns: int, rounds: int) -> None:
    tune_for_server()
    handler, app = build()
    start(handler)
    for name, path in ROUTES.items():
        await run(app, path, 2000, f"warm-{name}")
    costs: dict[str, list[float]] = {name: [] for name in ROUTES}
    for r in range(rounds):
        for name, path in ROUTES.items():
            began = time.process_time()
            await run(app, path, turns, f"{name}-{r}")
            costs[name].append((time.process_time() - began) / turns * 1e6)
    print(f"CPU us per request, {rounds} alternating rounds of {turns}, {CALLERS} callers:")
    for name, values in costs.items():
        rounded = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name:9} median {statistics.median(values):.0f} (rounds {rounded})")
    ratio = statistics.median(costs["trivial"]) / statistics.median(costs["pipeline"])
    print(f"  trivial / pipeline CPU: {ratio:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.rounds))
