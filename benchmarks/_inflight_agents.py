"""Agent for bench_nats_inflight.py: ``turn`` awaits AK_BENCH_TURN_SECONDS (a model call)."""

import asyncio
import os

from agentkernel import Agent, Module

SECONDS = float(os.environ.get("AK_BENCH_TURN_SECONDS", "1.0"))


async def turn(_turn):
    await asyncio.sleep(SECONDS)
    return "ok"


Module([Agent("turn", turn)])
