"""Upstream's ``agentkernel.pipeline.response_handler``: the same class.

Now in :mod:`agentkernel.pipeline.response_store.handler`.
"""

from agentkernel.pipeline.response_store.handler import ResponseHandler

__all__ = ["ResponseHandler"]
