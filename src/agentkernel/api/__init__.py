"""Upstream agentkernel's ``agentkernel.api`` import path: the base of extra REST handlers.

Imported lazily, so ``import agentkernel.api`` does not import FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from agentkernel.api.handler import RESTRequestHandler

__all__ = ["RESTRequestHandler"]

__getattr__ = lazy_getattr("agentkernel.api", {"RESTRequestHandler": "agentkernel.api.handler"})
