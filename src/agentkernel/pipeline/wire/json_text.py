"""Text a client sent inside JSON that no UTF-8 encoder can write back out.

JSON may spell a lone surrogate (``"\\ud800"``); Python decodes it into a string that every later
step (the turn's fingerprint, the queue message, a log line) fails to encode. A body holding one
is refused where it is read, naming the field, so nothing downstream meets it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["lone_surrogate_field"]


def lone_surrogate_field(data: Any, path: str = "") -> str | None:
    """The dotted path (``note``, ``items.2``) of the first key or string value in ``data``
    holding a lone surrogate, or ``None`` when it has none."""
    if isinstance(data, str):
        return (path or "<body>") if _unencodable(data) else None
    items: Any = ()
    if isinstance(data, dict):
        for key in data:
            if _unencodable(str(key)):
                return _join(path, str(key).encode("utf-8", "backslashreplace").decode())
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    for key, value in items:
        found = lone_surrogate_field(value, _join(path, str(key)))
        if found is not None:
            return found
    return None


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
