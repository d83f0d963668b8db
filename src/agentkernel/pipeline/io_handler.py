"""Upstream's ``agentkernel.pipeline.io_handler`` path of
:class:`~agentkernel.pipeline.process.io_handler.IOHandler` (the same class)."""

from agentkernel.pipeline.process.io_handler import IOHandler

__all__ = ["IOHandler"]
