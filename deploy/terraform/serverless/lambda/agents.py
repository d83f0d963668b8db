"""Example agents for the serverless stack: replace this file with your own definitions."""

from agentkernel import Agent, Module


async def echo(turn):
    turn.state["n"] = turn.state.get("n", 0) + 1
    return f"{turn.prompt} #{turn.state['n']}"


Module([Agent("echo", echo, "Repeats the prompt with a turn counter.")])
