"""Session state in Redis: one JSON string per session at ``<prefix>session:<id>``."""

from __future__ import annotations

import json
from typing import Any

import redis

from agentkernel.core.errors import ResponseStoreError
from agentkernel.session.base import SessionStore


class RedisSessionStore(SessionStore):
    """Args: url: Redis URL; prefix: key prefix; ttl: seconds state lives after a save."""

    def __init__(self, url: str, prefix: str = "ak:", ttl: float = 604800.0) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._prefix = prefix
        self._ttl_ms = int(ttl * 1000)

    def load(self, session_id: str) -> dict[str, Any]:
        try:
            raw = self._redis.get(f"{self._prefix}session:{session_id}")
        except redis.RedisError as exc:
            raise ResponseStoreError(f"Redis read of session {session_id} failed: {exc}") from exc
        return {} if raw is None else dict(json.loads(raw))

    def save(self, session_id: str, state: dict[str, Any]) -> None:
        text = json.dumps(state)
        try:
            self._redis.set(f"{self._prefix}session:{session_id}", text, px=self._ttl_ms)
        except redis.RedisError as exc:
            raise ResponseStoreError(f"Redis write of session {session_id} failed: {exc}") from exc

    def ping(self) -> None:
        self._redis.ping()
