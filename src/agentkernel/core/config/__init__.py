"""Configuration: the ``AKConfig`` model (``root``) and one module per section.

``agentkernel.core.config`` is a public path (``AKConfig``, ``AKConfigError``, ``require_extra``,
upstream's model names): every name of its modules reads through it, looked up in the order below
(``root`` first, then upstream's underscore names, then the sections).
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    for module in (
        "root",
        "aliases",
        "execution",
        "api",
        "logs",
        "queues",
        "stores",
        "auth",
        "limits",
        "turns",
        "webhooks",
    ):
        found = vars(importlib.import_module(f"{__name__}.{module}"))
        if name in found:
            return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
