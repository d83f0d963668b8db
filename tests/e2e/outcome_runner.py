"""Runner entry file for the turn-outcome end-to-end tests.

``remember`` keeps every prompt of the session in its state and answers with that list; the
prompt ``POISON`` kills the process (a turn that crashes its runner). Every run is appended to
``E2E_RUN_LOG`` so tests can count executions.
"""

import asyncio
import json
import os

from agentkernel import Agent, Module
from agentkernel.aws import ECSAgentRunner


async def remember(turn):
    if log := os.environ.get("E2E_RUN_LOG"):
        with open(log, "a") as f:
            f.write(f"{turn.request_id}:{turn.attempt}:{os.getpid()}\n")
    if turn.prompt == "POISON":
        os._exit(1)
    await asyncio.sleep(float(turn.extra.get("seconds", 0.5)))
    turn.state.setdefault("seen", []).append(turn.prompt)
    return json.dumps(turn.state["seen"])


Module([Agent("remember", remember)])

if __name__ == "__main__":
    ECSAgentRunner.run()
