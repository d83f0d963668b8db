"""Agent Runner Lambda: INPUT batch -> your agents -> OUTPUT; failed records are retried."""

import agents  # noqa: F401  (registers your agents: lambda/agents.py)

from agentkernel.aws import ServerlessAgentRunner

handler = ServerlessAgentRunner.handle
