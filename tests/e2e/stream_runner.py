"""Runner entry file for the streaming end-to-end tests: ``ticker`` yields a chunk every
``tick`` seconds (default 0.3), ``count`` chunks in all (default 5)."""

import asyncio

from agentkernel import Agent, Module


async def ticker(turn):
    tick = float(turn.extra.get("tick", 0.3))
    for i in range(int(turn.extra.get("count", 5))):
        if i:
            await asyncio.sleep(tick)
        yield f"c{i} "


Module([Agent("ticker", ticker)])
