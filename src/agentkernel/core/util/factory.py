"""Upstream's path of the factory helpers: :class:`AKConfigError`, :func:`require_extra` and
:func:`resolve_dotted`.

The first two are this package's own objects (``except AKConfigError`` catches what every
factory here raises). ``resolve_dotted`` keeps upstream's keyword signature over
:func:`agentkernel.core.extras.resolve_dotted`.
"""

from __future__ import annotations

from typing import TypeVar

from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra
from agentkernel.core.extras import resolve_dotted as _resolve_dotted

__all__ = ["AKConfigError", "require_extra", "resolve_dotted"]

T = TypeVar("T")


def resolve_dotted(path: str, *, base: type[T], error: type[Exception] = AKConfigError) -> type[T]:
    """Import the class at ``path`` (``package.module.Name``) and check it subclasses ``base``.

    Raises:
        error: (``AKConfigError`` unless given) the path is not dotted, cannot be imported, or
            names something that is not a subclass of ``base``.
    """
    try:
        found: type[T] = _resolve_dotted(path, base, "dotted path")
    except AKConfigError as exc:
        if error is AKConfigError:
            raise
        raise error(str(exc)) from exc
    return found
