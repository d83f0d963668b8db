"""The playground tests' agents: examples/echo.py's (``echo``, ``spell``) and ``fails``, which
streams one chunk and then raises, as a model that breaks mid-reply does."""

import runpy
from pathlib import Path

from agentkernel import Agent, Module

runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "echo.py"))


async def fails(turn):
    yield "partial "
    raise ValueError("the model said no")


Module([Agent("fails", fails, "Streams one chunk, then fails.")])
