"""Upstream's ``agentkernel.pipeline.thread_runner`` path of
:class:`~agentkernel.pipeline.runtime.thread_runner.ThreadRunner` (the same class)."""

from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

__all__ = ["ThreadRunner"]
