"""Agents for bench_streaming.py: ``stamp`` yields its own clock as its first token (so the
client can measure the delay to first token), ``burst`` yields ``count`` chunks at once, and
``paced`` yields ``count`` chunks ``interval`` seconds apart (a model's pace), each its own clock
(so the client can measure every chunk's delay)."""

import asyncio
import time

from agentkernel import Agent, Module


async def stamp(turn):
    yield f"{time.time():.6f}"


async def burst(turn):
    for i in range(int(turn.extra.get("count", 200))):
        yield f"{i} "


async def paced(turn):
    interval = float(turn.extra.get("interval", 0.02))
    for _ in range(int(turn.extra.get("count", 50))):
        yield f"{time.time():.6f} "
        await asyncio.sleep(interval)


Module([Agent("stamp", stamp), Agent("burst", burst), Agent("paced", paced)])
