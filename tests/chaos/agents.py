"""The chaos suite's agent, loaded by every runner process (and by the embedded server).

``recorder`` keeps the prompts of its session in ``turn.state["prompts"]`` and replies with that
list as JSON, so a reply shows exactly which turns the session state holds: a turn lost, applied
twice or applied out of order is visible in the next reply. The prompt ``POISON`` kills the
process that runs it (``os._exit(1)``), every time it is delivered. The prompt ``SLOW`` takes
``CHAOS_SLOW_SECONDS`` (a long model call that other sessions' turns overtake).
"""

import asyncio
import json
import os

from agentkernel import Agent, Module

POISON = "POISON"
TURN_SECONDS = float(os.environ.get("CHAOS_TURN_SECONDS", "0.1"))
SLOW = "SLOW"
SLOW_SECONDS = float(os.environ.get("CHAOS_SLOW_SECONDS", "15"))


async def record(turn):
    if turn.prompt == POISON:
        os._exit(1)
    await asyncio.sleep(
        SLOW_SECONDS if turn.prompt == SLOW else TURN_SECONDS
    )  # a model call: keeps turns in flight when a fault hits
    prompts = [*turn.state.get("prompts", []), turn.prompt]
    turn.state["prompts"] = prompts
    return json.dumps(prompts)


Module([Agent("recorder", record)])
