"""Agent for bench_scaleout.py: ``wait50`` awaits 50 ms (a model call) and answers."""

import asyncio

from agentkernel import Agent, Module


async def wait50(turn):
    await asyncio.sleep(0.05)
    return "ok"


Module([Agent("wait50", wait50)])
