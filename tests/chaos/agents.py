"""The chaos suite's agent, loaded by every runner process (and by the embedded server).

``recorder`` keeps the prompts of its session in ``turn.state["prompts"]`` and replies with that
list as JSON, so a reply shows exactly which turns the session state holds: a turn lost, applied
twice or applied out of order is visible in the next reply. The prompt ``POISON`` kills the
process that runs it (``os._exit(1)``), every time it is delivered.
"""

import asyncio
import json
import os

from agentkernel import Agent, Module

POISON = "POISON"
TURN_SECONDS = float(os.environ.get("CHAOS_TURN_SECONDS", "0.1"))


async def record(turn):
    if turn.prompt == POISON:
        os._exit(1)
    await asyncio.sleep(TURN_SECONDS)  # a model call: keeps turns in flight when a fault hits
    prompts = [*turn.state.get("prompts", []), turn.prompt]
    turn.state["prompts"] = prompts
    return json.dumps(prompts)


Module([Agent("recorder", record)])
