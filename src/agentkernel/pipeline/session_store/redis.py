"""Session records in Redis: a hash ``<prefix>sess:<id>`` with the version ``v`` and ``doc``.

A commit is one Lua script (compare the version, write, refresh the TTL), so it is atomic
against every other runner process. A session without a record is new only while the store's
epoch is intact (:mod:`agentkernel.core.redis_guard`); otherwise the read raises
:class:`StoreDataLostError` rather than start the session again from nothing.

Every redis-py exception is mapped by :mod:`agentkernel.core.redis_errors`: connection trouble
becomes :class:`SessionStoreUnavailableError` (worth retrying), a full server
:class:`StoreFullError` (also worth retrying), anything else :class:`SessionStoreError`.
"""

from __future__ import annotations

import functools

from agentkernel.core.errors import (
    SessionStoreError,
    SessionStoreUnavailableError,
    StaleSessionError,
    StoreFullError,
)
from agentkernel.core.redis_errors import connect, redis_errors
from agentkernel.core.redis_guard import RedisGuard, start_guard
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore

_errors = functools.partial(
    redis_errors,
    unavailable=SessionStoreUnavailableError,
    failed=SessionStoreError,
    full=StoreFullError,
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
    """Session records in Redis.

    Args:
        url: Redis URL.
        prefix: key prefix.
        ttl: seconds a session lives after a write.
        allow_eviction: run on a server whose eviction policy may drop sessions.

    Raises:
        AKConfigError: the URL is malformed, or the server may evict and ``allow_eviction``
            is off.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "ak:",
        ttl: float = 604800.0,
        *,
        allow_eviction: bool = False,
    ) -> None:
        self._redis = connect(url, "session.redis.url")
        self._prefix = prefix
        self._ttl_ms = int(ttl * 1000)
        self._cas = self._redis.register_script(_COMPARE_AND_SET)
        self._guard = RedisGuard(
            self._redis, prefix, "session.redis", allow_eviction=allow_eviction
        )
        start_guard(self._guard, "session.redis")

    def _key(self, session_id: str) -> str:
        return f"{self._prefix}sess:{session_id}"

    def read(self, session_id: str) -> SessionRecord:
        with _errors(f"read of session {session_id}"):
            self._guard.ensure()
            version, doc = self._redis.hmget(self._key(session_id), ["v", "doc"])
            if doc is None:
                self._guard.check_miss(f"session {session_id}")
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
            self._guard.probe()

    def warnings(self) -> list[str]:
        return list(self._guard.warnings)
