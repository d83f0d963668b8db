"""The guide's runner entry file, with agents made for the end-to-end tests."""

import asyncio
import json
import os
import time

from agentkernel import Agent, Module, RetryableError
from agentkernel.aws import ECSAgentRunner


async def timed(turn):
    """Reports when it ran, so tests can check order and exclusivity across processes."""
    start = time.time()
    if log := os.environ.get("E2E_RUN_LOG"):
        with open(log, "a") as f:
            f.write(f"{turn.request_id} {turn.attempt}\n")
    await asyncio.sleep(float(turn.extra.get("seconds", 0.05)))
    return json.dumps(
        {
            "prompt": turn.prompt,
            "start": start,
            "end": time.time(),
            "pid": os.getpid(),
            "attempt": turn.attempt,
        }
    )


async def poison(turn):
    raise RetryableError("always fails")


Module([Agent("timed", timed), Agent("poison", poison)])

handler = ECSAgentRunner.run

if __name__ == "__main__":
    handler()
