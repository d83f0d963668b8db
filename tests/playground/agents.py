"""The playground tests' agents: examples/echo.py's (``echo``, ``spell``); ``fails``, which
streams one chunk and then raises, as a model that breaks mid-reply does; and ``once``, which
asks for its first delivery to be retried, as a rate-limited model does."""

import runpy
from pathlib import Path

from agentkernel import Agent, Module, RetryableError

runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "echo.py"))


async def fails(turn):
    yield "partial "
    raise ValueError("the model said no")


async def once(turn):
    if turn.attempt == 1:
        raise RetryableError("rate limited; try again")
    return f"answered on delivery {turn.attempt}"


Module(
    [
        Agent("fails", fails, "Streams one chunk, then fails."),
        Agent("once", once, "Retried once, then answers."),
    ]
)
