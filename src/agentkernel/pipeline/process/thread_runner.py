"""Upstream's ``agentkernel.pipeline.process.thread_runner``: the same class.

Now in :mod:`agentkernel.pipeline.runtime.thread_runner`.
"""

from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

__all__ = ["ThreadRunner"]
