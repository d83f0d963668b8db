"""Two tiny agents for trying agentkernel out: ``agentkernel serve examples/echo.py``."""

import asyncio

from agentkernel import Agent, Module


async def echo(turn):
    """Repeat the prompt and count the turns of this session."""
    turn.state["n"] = turn.state.get("n", 0) + 1
    return f"{turn.prompt} #{turn.state['n']}"


async def spell(turn):
    """A streaming agent: yields the prompt one word at a time, slowly enough to watch."""
    for word in turn.prompt.split():
        await asyncio.sleep(0.2)
        yield word + " "


Module(
    [
        Agent("echo", echo, "Repeats the prompt with a turn counter."),
        Agent("spell", spell, "Streams the prompt back word by word."),
    ]
)
