"""Agents for the observability tests, run by the ``agentkernel`` command."""

import asyncio

from agentkernel import Agent, Module, RetryableError


async def slow(turn):
    await asyncio.sleep(float(turn.prompt))
    return "done"


async def flaky(turn):
    raise RetryableError("the model is overloaded")


Module([Agent("slow", slow), Agent("flaky", flaky)])
