"""Streaming Agent Runner Lambda: one OUTPUT message per token chunk (WebSocket streaming)."""

import agents  # noqa: F401  (registers your agents: lambda/agents.py)

from agentkernel.aws import ServerlessStreamAgentRunner

handler = ServerlessStreamAgentRunner.handle
