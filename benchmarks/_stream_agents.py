"""Agents for bench_streaming.py: ``stamp`` yields its own clock as its first token (so the
client can measure the delay to first token), ``burst`` yields ``count`` chunks at once."""

import time

from agentkernel import Agent, Module


async def stamp(turn):
    yield f"{time.time():.6f}"


async def burst(turn):
    for i in range(int(turn.extra.get("count", 200))):
        yield f"{i} "


Module([Agent("stamp", stamp), Agent("burst", burst)])
