"""The ``agentkernel`` command: ``commands`` (entry point), ``server``, ``reload``, ``sessions``."""

from __future__ import annotations

from agentkernel.core.lazy import lazy_getattr

__getattr__ = lazy_getattr("agentkernel.cli", {"main": "agentkernel.cli.commands"})
