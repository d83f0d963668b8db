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
    ("api", "enabled_routes"): "upstream route selection (every route is on here)",
    ("logging", "system"): "upstream system logging (logging.ak sets the level here)",
    ("library_version",): "the upstream library version pin",
    ("trace",): "upstream tracing integrations (W3C traceparent travels with every turn here)",
    ("a2a",): "upstream agent-to-agent endpoints",
    ("mcp",): "upstream MCP servers",
    ("multimodal",): "upstream multimodal attachments",
    ("guardrail",): "upstream guardrails",
    ("test",): "the upstream test harness",
    ("slack",): "the upstream Slack integration",
    ("whatsapp",): "the upstream WhatsApp integration",
    ("messenger",): "the upstream Messenger integration",
    ("instagram",): "the upstream Instagram integration",
    ("telegram",): "the upstream Telegram integration",
    ("teams",): "the upstream Microsoft Teams integration",
    ("gmail",): "the upstream Gmail integration",
    ("livekit",): "the upstream LiveKit voice gateway",
    ("agui",): "the upstream AG-UI endpoint",
    ("okf",): "upstream knowledge bundles",
    ("secret",): "upstream secret providers",
    ("session", "cosmosdb"): "the upstream Cosmos DB session store",
    ("session", "firestore"): "the upstream Firestore session store",
}

#: Upstream keys that set something this package keeps one level up: read there, unless that
#: key is set too.
UPSTREAM_MOVED: dict[tuple[str, ...], tuple[str, ...]] = {
    **{
        ("execution", "response_store", backend, "ttl"): ("execution", "response_store", "ttl")
        for backend in ("redis", "valkey", "dynamodb")
    },
    **{
        ("session", backend, "ttl"): ("session", "ttl")
        for backend in ("redis", "valkey", "dynamodb")
    },
}


def drop_upstream_keys(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a raw configuration without upstream-only keys, warning once per key found;
    keys upstream keeps in a backend block that this package keeps one level up are moved, and
    Valkey stores are read as Redis ones."""
    data = dict(data)
    for section in (("execution", "response_store"), ("session",)):
        _valkey_as_redis(data, section)
    for path, target in UPSTREAM_MOVED.items():
        block = _parent(data, path)
        if block is None or path[-1] not in block:
            continue
        value = _copy_path(data, path[:-1]).pop(path[-1])
        destination = _parent(data, target)
        if destination is not None and target[-1] not in destination:
            _copy_path(data, target[:-1])[target[-1]] = value
            logger.warning("config key %s is read as %s", ".".join(path), ".".join(target))
        else:
            logger.warning(
                "config key %s is ignored: %s is set (or %s is not a block)",
                ".".join(path),
                ".".join(target),
                ".".join(target[:-1]),
            )
    for path, purpose in UPSTREAM_ONLY.items():
        block = _parent(data, path)
        if block is not None and path[-1] in block:
            del _copy_path(data, path[:-1])[path[-1]]  # copies nested blocks before changing
            logger.warning(
                "config key %s is ignored: it configures %s, which agentkernel does not have",
                ".".join(path),
                purpose,
            )
    return data


def _valkey_as_redis(data: dict[str, Any], section: tuple[str, ...]) -> None:
    """Upstream's ``valkey`` store type and block: Valkey speaks the Redis protocol, so they are
    read as ``redis`` (``valkey://`` URLs as ``redis://``)."""
    block = _parent(data, (*section, "type"))
    if block is None or (block.get("type") != "valkey" and "valkey" not in block):
        return
    block = _copy_path(data, section)
    name = ".".join(section)
    if block.get("type") == "valkey":
        block["type"] = "redis"
        logger.warning("config key %s.type: valkey is read as redis", name)
    if "valkey" in block:
        valkey = block.pop("valkey")
        if "redis" in block or not isinstance(valkey, dict):
            logger.warning("config key %s.valkey is ignored: %s.redis is set", name, name)
            return
        url = str(valkey.get("url", ""))
        for scheme, redis_scheme in (("valkeys://", "rediss://"), ("valkey://", "redis://")):
            if url.startswith(scheme):
                valkey = valkey | {"url": redis_scheme + url.removeprefix(scheme)}
        block["redis"] = valkey
        logger.warning("config key %s.valkey is read as %s.redis", name, name)


def _parent(data: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    """The block holding the last key of ``path``, or ``None`` when a block on the way is not
    there (or not a mapping)."""
    node: Any = data
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


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
