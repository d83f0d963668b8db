"""Configuration: the ``AKConfig`` model (``root``) and one module per section.

``agentkernel.core.config`` is a public path (``AKConfig``, ``AKConfigError``, ``require_extra``,
upstream's model names): every name of :mod:`agentkernel.core.config.root` reads through it.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("agentkernel.core.config.root"), name)
