"""Upstream's path of :class:`~agentkernel.pipeline.runtime.thread_runner.ThreadRunner`.

The same class, so ``ThreadRunner.shutdown_event`` is one event whichever path imported it.
"""

from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

__all__ = ["ThreadRunner"]
