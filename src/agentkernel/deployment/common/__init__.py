"""Upstream's ``agentkernel.deployment.common``: the thread runner, under its old path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

__all__ = ["ThreadRunner"]

__getattr__ = lazy_getattr(
    "agentkernel.deployment.common",
    {"ThreadRunner": "agentkernel.pipeline.runtime.thread_runner"},
)
