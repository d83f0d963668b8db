"""Session records in Redis: a hash ``<prefix>sess:<id>`` with the version ``v`` and ``doc``.

A commit is one Lua script (compare the version, write, refresh the TTL), so it is atomic
against every other runner process.
"""

from __future__ import annotations

import redis

from agentkernel.core.errors import (
    SessionStoreError,
    SessionStoreUnavailableError,
    StaleSessionError,
)
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore

# Returns -1 when written, else the version found (the caller's read is stale).
_COMPARE_AND_SET = """
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if v ~= tonumber(ARGV[1]) then return v end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'doc', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return -1
"""


class RedisSessionStore(SessionStore):
    """Args: url: Redis URL; prefix: key prefix; ttl: seconds a session lives after a write."""

    def __init__(self, url: str, prefix: str = "ak:", ttl: float = 604800.0) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._prefix = prefix
        self._ttl_ms = int(ttl * 1000)
        self._cas = self._redis.register_script(_COMPARE_AND_SET)

    def _key(self, session_id: str) -> str:
        return f"{self._prefix}sess:{session_id}"

    def read(self, session_id: str) -> SessionRecord:
        try:
            version, doc = self._redis.hmget(self._key(session_id), ["v", "doc"])
        except redis.RedisError as exc:
            raise _mapped(exc, f"Redis read of session {session_id} failed") from exc
        if doc is None:
            return SessionRecord()
        return SessionRecord.decode(doc, int(version or 0))

    def write(self, session_id: str, record: SessionRecord, *, expected_version: int) -> None:
        doc = record.encode()
        args: list[str | int] = [expected_version, record.version, doc, self._ttl_ms]
        try:
            found = int(self._cas(keys=[self._key(session_id)], args=args))
        except redis.RedisError as exc:
            raise _mapped(exc, f"Redis write of session {session_id} failed") from exc
        if found != -1:
            raise StaleSessionError(
                f"session {session_id} is at version {found}, not {expected_version}"
            )

    def ping(self) -> None:
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            raise _mapped(exc, "Redis session store unreachable") from exc


def _mapped(exc: redis.RedisError, what: str) -> SessionStoreError:
    """A lost or refused connection, or a timeout, is worth retrying; anything else is not."""
    unreachable = isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
    kind = SessionStoreUnavailableError if unreachable else SessionStoreError
    return kind(f"{what}: {exc}")
