"""Settings for an Agent Runner built directly by a test."""

from __future__ import annotations

from agentkernel.core.config.execution import ExecutionConfig, RunnerConfig
from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.config.root import AKConfig


def config_with(runner: RunnerConfig, queues: QueuesConfig | None = None) -> AKConfig:
    """The loaded configuration with these runner (and queue) settings."""
    execution = ExecutionConfig(runner=runner, queues=queues or QueuesConfig())
    return AKConfig.load().model_copy(update={"execution": execution})
