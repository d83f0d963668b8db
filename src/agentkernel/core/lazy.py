"""Package attributes imported on first use, so importing a package stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``names[attr]`` (a module path) on first access."""

    def __getattr__(attr: str) -> Any:
        if attr in names:
            return getattr(importlib.import_module(names[attr]), attr)
        raise AttributeError(f"module {package!r} has no attribute {attr!r}")

    return __getattr__
