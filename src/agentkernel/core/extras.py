"""Helpers for optional dependencies and dotted-path plug-ins."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentkernel.core.errors import AKConfigError


@contextmanager
def require_extra(extra: str, feature: str) -> Iterator[None]:
    """Turn an ``ImportError`` inside the block into one that says which extra to install.

    Args:
        extra: the name of the ``agentkernel[...]`` extra that provides the dependency.
        feature: what the user asked for, e.g. ``"execution.queues.type: nats"``.

    Raises:
        ImportError: with an install hint, chained to the original error.
    """
    try:
        yield
    except ImportError as exc:
        raise ImportError(
            f"{feature} requires the '{extra}' extra: pip install 'agentkernel[{extra}]'"
        ) from exc


def resolve_dotted(path: str, base: type, key: str) -> Any:
    """Import ``package.module.Name`` (or ``package.module:Name``) and check it subclasses base.

    Args:
        path: the dotted path to a class.
        base: the class the result must subclass.
        key: the configuration key the path came from, for error messages.

    Raises:
        AKConfigError: when the path cannot be imported or names something else.
    """
    module_name, _, attr = path.replace(":", ".").rpartition(".")
    if not module_name:
        raise AKConfigError(f"{key}: '{path}' is not a dotted path to a class")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise AKConfigError(f"{key}: cannot import '{path}': {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise AKConfigError(f"{key}: '{path}' is not a subclass of {base.__name__}")
    return obj
