"""Upstream's ``agentkernel.pipeline.request_handler``: the same class.

Now in :mod:`agentkernel.pipeline.http.request_handler`.
"""

from agentkernel.pipeline.http.request_handler import RequestHandler

__all__ = ["RequestHandler"]
