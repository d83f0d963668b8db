"""Upstream's ``agentkernel.pipeline.agent_runner``: the same class.

Now in :mod:`agentkernel.pipeline.runner.agent_runner`.
"""

from agentkernel.pipeline.runner.agent_runner import AgentRunner

__all__ = ["AgentRunner"]
