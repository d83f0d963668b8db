"""agentkernel: run AI-agent chat turns behind message queues.

Define agents with :class:`Agent` and register them with :class:`Module`; run them with the
``agentkernel serve`` command or the entry points in :mod:`agentkernel.aws`.
"""

from __future__ import annotations

from agentkernel.core.agent import Agent, AgentRegistry, Module, Turn
from agentkernel.core.errors import AgentKernelError, AKConfigError, RetryableError

__version__ = "0.1.0.dev0"

__all__ = [
    "AKConfigError",
    "Agent",
    "AgentKernelError",
    "AgentRegistry",
    "Module",
    "RetryableError",
    "Turn",
    "__version__",
]
