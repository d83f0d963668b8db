"""The Agent Runner container's entry file (queue-mode guide): agent definitions only.

The model is reached through the OpenAI SDK's own environment: ``OPENAI_API_KEY``, plus
``OPENAI_BASE_URL`` for any OpenAI-compatible server. To try it without a network, start
``python -m agentkernel.testing.fake_openai --port 8100`` and set
``OPENAI_BASE_URL=http://127.0.0.1:8100/v1 OPENAI_API_KEY=sk-fake``.
"""

import os

from agents import Agent, function_tool

from agentkernel.aws import ECSAgentRunner
from agentkernel.openai import OpenAIModule


@function_tool
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


assistant = Agent(
    name="assistant",
    instructions="Assistant. Answer briefly; use word_count to count words.",
    tools=[word_count],
    model=os.environ.get("OPENAI_MODEL", "gpt-4.1-mini"),
)

OpenAIModule([assistant])  # agent definitions here only

handler = ECSAgentRunner.run

if __name__ == "__main__":
    handler()
