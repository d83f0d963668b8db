"""Upstream's ``agentkernel.pipeline.thread_runner`` path of
:class:`~agentkernel.pipeline.process.thread_runner.ThreadRunner` (the same class)."""

from agentkernel.pipeline.process.thread_runner import ThreadRunner

__all__ = ["ThreadRunner"]
