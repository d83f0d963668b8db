from agentkernel import Agent, Module
from agentkernel.aws import ECSAgentRunner


async def assistant(turn):
    turn.state["turns"] = turn.state.get("turns", 0) + 1
    return f"You said {turn.prompt!r} (turn {turn.state['turns']} of this session)"


Module([Agent("assistant", assistant)])  # agent definitions here only

handler = ECSAgentRunner.run

if __name__ == "__main__":
    handler()
