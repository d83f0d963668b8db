"""CPU per no-op turn of the embedded app, driven in-process: the pipeline without an HTTP server.

``bench_embedded.py`` measures turns over HTTP, where uvicorn's own work is most of the trivial
route's cost and part of every turn's. This calls the app as an ASGI callable on one event loop
(the embedded defaults: in-memory queues, stores and the runner on the same loop), 32 callers at
once, each turn in a new session, so what it reports is the pipeline's work and FastAPI's, not
the server's. Both paths are measured in the same process, alternating, with the server's garbage
collector settings (``tune_for_server``).

Usage: python benchmarks/bench_asgi_inprocess.py [--turns 3000] [--rounds 5] [--baseline SRC]

With ``--baseline SRC`` (the ``src`` folder of another checkout, e.g. ``git archive <rev> src |
tar -x -C /tmp/base``) each round runs in a child process per code, alternating this code and
that one, and the trivial route, which neither code changes, is the control: a code's turn is
compared as its multiple of the trivial route measured in the same process, so a round that the
machine slowed down counts as little against one code as against the other.

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

from child_runs import child_result
from fastapi import Request

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.consumer.in_loop import InLoopConsumer
from agentkernel.pipeline.http.request_handler import parse_chat
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.runtime.collector import tune_for_server

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


async def measure(turns: int, rounds: int) -> dict[str, list[float]]:
    """CPU microseconds per request of each route, for each of ``rounds`` alternating rounds."""
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
    return costs


def report(turns: int, rounds: int) -> None:
    costs = asyncio.run(measure(turns, rounds))
    print(f"CPU us per request, {rounds} alternating rounds of {turns}, {CALLERS} callers:")
    for name, values in costs.items():
        rounded = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name:9} median {statistics.median(values):.0f} (rounds {rounded})")
    ratio = statistics.median(costs["trivial"]) / statistics.median(costs["pipeline"])
    print(f"  trivial / pipeline CPU: {ratio:.2f}")


def compare(turns: int, rounds: int, baseline: str) -> None:
    codes = {"this": None, "baseline": baseline}
    multiples: dict[str, list[float]] = {name: [] for name in codes}
    costs: dict[str, dict[str, list[float]]] = {
        name: {route: [] for route in ROUTES} for name in codes
    }
    for _ in range(rounds):  # alternating, so the machine's noise hits both alike
        for name, src in codes.items():
            got = child_result(__file__, src, "--turns", str(turns))
            for route in ROUTES:
                costs[name][route] += got[route]
            multiples[name].append(got["pipeline"][0] / got["trivial"][0])
    print(f"CPU us per request, {rounds} alternating child processes per code, {turns} each:")
    print("| code | pipeline | trivial route | pipeline / trivial, per round | median |")
    print("|---|---|---|---|---|")
    for name in codes:
        pipeline, trivial = costs[name]["pipeline"], costs[name]["trivial"]
        rounded = ", ".join(f"{m:.2f}" for m in multiples[name])
        print(
            f"| {name} | {statistics.median(pipeline):.0f} | {statistics.median(trivial):.0f} "
            f"| {rounded} | {statistics.median(multiples[name]):.2f} |"
        )
    change = statistics.median(multiples["this"]) / statistics.median(multiples["baseline"])
    print(f"this / baseline, as multiples of the trivial route: {change:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="src folder of the code to compare with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(measure(args.turns, 1))))
    elif args.baseline:
        compare(args.turns, args.rounds, args.baseline)
    else:
        report(args.turns, args.rounds)
