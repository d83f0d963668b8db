"""Reading ``config.yaml`` files written for the upstream agentkernel queue mode.

Keys of upstream features this package does not have are dropped with a warning naming each;
a key nobody knows (a typo) stays an error, and the error names the closest valid key.
"""

from __future__ import annotations

import difflib
import logging
import types
import typing
from typing import Any

from pydantic import BaseModel

logger = logging.getLogger(__name__)

#: Upstream keys for features agentkernel does not have, and what they were for.
UPSTREAM_ONLY: dict[tuple[str, ...], str] = {
    ("websocket_api",): "the upstream WebSocket gateway (see api.websocket here)",
    ("sandbox",): "upstream code sandboxes",
    ("thread",): "upstream thread storage",
    ("schedule",): "upstream scheduled chats",
    ("execution", "realtime"): "upstream realtime voice playback",
    ("session", "cache"): "the upstream session cache",
    ("session", "connection_store"): "the upstream WebSocket connection store",
    ("api", "custom_router_prefix"): "upstream custom routers",
    ("api", "max_file_size"): "upstream file uploads (api.max_body_bytes bounds bodies here)",
}


def drop_upstream_keys(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a raw configuration without upstream-only keys, warning once per key found."""
    data = dict(data)
    for path, purpose in UPSTREAM_ONLY.items():
        parent: Any = data
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and path[-1] in parent:
            if parent is not data:  # copy the nested block before changing it
                parent = _copy_path(data, path[:-1])
            del parent[path[-1]]
            logger.warning(
                "config key %s is ignored: it configures %s, which agentkernel does not have",
                ".".join(path),
                purpose,
            )
    return data


def _copy_path(data: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = data
    for key in path:
        node[key] = dict(node[key])
        node = node[key]
    return node


def closest_key(model: type[BaseModel], loc: tuple[str | int, ...]) -> str | None:
    """The valid key nearest to the unknown last element of ``loc`` (a typo), if one is close."""
    fields = _fields_at(model, loc[:-1])
    matches = difflib.get_close_matches(str(loc[-1]), fields, n=1, cutoff=0.6)
    if not matches:
        return None
    return ".".join([*map(str, loc[:-1]), matches[0]])


def _fields_at(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    current: type[BaseModel] | None = model
    for key in path:
        field = None if current is None else current.model_fields.get(str(key))
        current = None if field is None else model_of(field.annotation)
    return [] if current is None else list(current.model_fields)


def model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model inside ``annotation`` (``Block``, ``Block | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if (found := model_of(arg)) is not None:
                return found
    return None
