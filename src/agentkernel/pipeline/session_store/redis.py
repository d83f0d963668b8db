"""Session records in Redis: a hash ``<prefix>sess:<id>`` with the version ``v`` and ``doc``.

A commit is one Lua script (compare the version, write, refresh the TTL), so it is atomic
against every other runner process. Every redis-py exception is mapped by
:mod:`agentkernel.core.redis_errors`: connection trouble becomes
:class:`SessionStoreUnavailableError` (worth retrying), anything else :class:`SessionStoreError`.
"""

from __future__ import annotations

import functools

from agentkernel.core.errors import (
    SessionStoreError,
    SessionStoreUnavailableError,
    StaleSessionError,
)
from agentkernel.core.redis_errors import connect, redis_errors
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore

_errors = functools.partial(
    redis_errors, unavailable=SessionStoreUnavailableError, failed=SessionStoreError
)

# Returns -1 when written, else the version found (the caller's read is stale).
_COMPARE_AND_SET = """
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if v ~= tonumber(ARGV[1]) then return v end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'doc', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return -1
"""


class RedisSessionStore(SessionStore):
    """Args: url: Redis URL; prefix: key prefix; ttl: seconds a session lives after a write.

    Raises:
        AKConfigError: the URL is malformed.
    """

    def __init__(self, url: str, prefix: str = "ak:", ttl: float = 604800.0) -> None:
        self._redis = connect(url, "session.redis.url")
        self._prefix = prefix
        self._ttl_ms = int(ttl * 1000)
        self._cas = self._redis.register_script(_COMPARE_AND_SET)

    def _key(self, session_id: str) -> str:
        return f"{self._prefix}sess:{session_id}"

    def read(self, session_id: str) -> SessionRecord:
        with _errors(f"read of session {session_id}"):
            version, doc = self._redis.hmget(self._key(session_id), ["v", "doc"])
        if doc is None:
            return SessionRecord()
        return SessionRecord.decode(doc, int(version or 0))

    def write(self, session_id: str, record: SessionRecord, *, expected_version: int) -> None:
        doc = record.encode()
        args: list[str | int] = [expected_version, record.version, doc, self._ttl_ms]
        with _errors(f"write of session {session_id}"):
            found = int(self._cas(keys=[self._key(session_id)], args=args))
        if found != -1:
            raise StaleSessionError(
                f"session {session_id} is at version {found}, not {expected_version}"
            )

    def ping(self) -> None:
        with _errors("ping of the session store"):
            self._redis.ping()
