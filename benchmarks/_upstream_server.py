"""Benchmark server: upstream agentkernel's REST API without any queue, for comparison.

Run by bench_embedded.py with ``--upstream PYTHON``, a Python 3.12 interpreter that has
``agentkernel==0.9.5`` installed with its ``api`` extra (plus ``python-multipart``, which its
multipart route needs), never with this project. It serves upstream's own chat route over its
direct execution path (no input queue, no runner, no reply store): ``RESTAPI.build_app`` with the
default chat handler, run by uvicorn as ``RESTAPI.run`` does. Two agents, written against
upstream's public agent and runner classes: ``noop`` answers at once, ``sleep1`` awaits 1 s.

Usage: PYTHON benchmarks/_upstream_server.py PORT
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

# Upstream's package, which has the same name as this project's: the import sorter would split
# these by which of its modules happen to exist here too.
from agentkernel.api.handler import AgentRESTRequestHandler  # isort: skip
from agentkernel.api.http import RESTAPI  # isort: skip
from agentkernel.core.base import Agent, Runner  # isort: skip
from agentkernel.core.model import AgentReplyText  # isort: skip
from agentkernel.core.runtime import Runtime  # isort: skip


class WaitingRunner(Runner):
    """Answers "ok" after awaiting ``wait`` seconds (none: at once)."""

    def __init__(self, wait: float) -> None:
        super().__init__("bench")
        self.wait = wait

    async def run(self, agent: Any, session: Any, requests: list[Any]) -> Any:
        if self.wait:
            await asyncio.sleep(self.wait)
        return AgentReplyText(response="ok")

    async def stream(self, agent: Any, session: Any, requests: list[Any]) -> AsyncIterator[Any]:
        raise NotImplementedError
        yield


class BenchAgent(Agent):
    """A bring-your-own agent with nothing behind it but its runner."""

    def get_description(self) -> str:
        return "benchmark agent"

    def override_system_prompt(self, prompt: str) -> None:
        pass

    def attach_tool(self, tool: Any) -> None:
        pass

    def get_a2a_card(self) -> Any:
        return None


def main(port: int) -> None:
    # Upstream warns once per new session, and every benchmark request opens one: silenced, so
    # the comparison is against its route alone (which makes the ratio harder for us, not easier).
    logging.disable(logging.WARNING)
    Runtime.current().register(BenchAgent("noop", WaitingRunner(0.0)))
    Runtime.current().register(BenchAgent("sleep1", WaitingRunner(1.0)))
    app = RESTAPI.build_app([AgentRESTRequestHandler()])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main(int(sys.argv[1]))
