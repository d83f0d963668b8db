"""Session records in Redis: a hash ``<prefix>sess:<id>`` with the version ``v`` and ``doc``.

A commit is one Lua script (compare the version, write, refresh the TTL, and refresh the
session's entry in its identity's index, the sorted set ``<prefix>sessions:<scope>`` scored by
the write's time in milliseconds), so it is atomic against every other runner process. A turn's
commit (:meth:`RedisSessionStore.commit_turn`) also closes the turn in the turn signals kept
beside the sessions, in the same script. A
session without a record is new only while the store's
epoch is intact (:mod:`agentkernel.core.redis_guard`); otherwise the read raises
:class:`StoreDataLostError` rather than start the session again from nothing.

Every redis-py exception is mapped by :mod:`agentkernel.core.redis_errors`: connection trouble
becomes :class:`SessionStoreUnavailableError` (worth retrying), a full server
:class:`StoreFullError` (also worth retrying), anything else :class:`SessionStoreError`.
"""

from __future__ import annotations

import functools
from typing import Any

from agentkernel.core.errors import (
    SessionStoreError,
    SessionStoreUnavailableError,
    StaleSessionError,
    StoreFullError,
)
from agentkernel.core.redis_client import require_one_slot
from agentkernel.core.redis_errors import connect, redis_errors
from agentkernel.core.redis_guard import RedisGuard, start_guard
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore, TurnOutcome
from agentkernel.pipeline.session_store.index import (
    SessionEntry,
    SessionPage,
    now_ms,
    page_of,
    scope_of,
)
from agentkernel.pipeline.turn_control.signals import TurnSignals
from agentkernel.pipeline.turn_control.signals_redis import RedisTurnSignals, open_key, turn_key
from agentkernel.pipeline.wire.position import Position

_errors = functools.partial(
    redis_errors,
    unavailable=SessionStoreUnavailableError,
    failed=SessionStoreError,
    full=StoreFullError,
)

# KEYS: the record, then its identity's index when ARGV[5] (now, ms) is not '', then the
# session's open turns and the turn's key when ARGV[7] (the turn to close) is not ''.
# Returns -1 when written, else the version found (the caller's read is stale). The close is
# best effort (pcall: an error there leaves the commit written and answered as such).
_COMPARE_AND_SET = """
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if v ~= tonumber(ARGV[1]) then return v end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'doc', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local k = 2
if ARGV[5] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[6])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[5]) - tonumber(ARGV[4]))
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  k = 3
end
if ARGV[7] ~= '' then
  redis.pcall('ZREM', KEYS[k], ARGV[7])
  redis.pcall('DEL', KEYS[k + 1])
end
return -1
"""

# Erases a session: its record and its entry in the index.
_DELETE = """
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
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

    lists_sessions = True

    def __init__(
        self,
        url: str,
        prefix: str = "ak:",
        ttl: float = 604800.0,
        *,
        allow_eviction: bool = False,
    ) -> None:
        self._redis = connect(url, "session.redis.url")
        require_one_slot(self._redis, "session.redis", prefix)
        self._prefix = prefix
        self._ttl_ms = int(ttl * 1000)
        self._cas = self._redis.register_script(_COMPARE_AND_SET)
        self._delete = self._redis.register_script(_DELETE)
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

    def _index_key(self, scope: str) -> str:
        return f"{self._prefix}sessions:{scope}"

    def write(self, session_id: str, record: SessionRecord, *, expected_version: int) -> None:
        self._write(session_id, record, expected_version, None)

    def commit_turn(
        self,
        session_id: str,
        base: SessionRecord,
        outcome: TurnOutcome,
        state: dict[str, Any] | None,
        position: Position | None = None,
    ) -> SessionRecord:
        """The commit and the close in one script, one round trip, when the signals are this
        store's own (:class:`RedisTurnSignals` beside the records) and a subclass changed
        neither ``commit`` nor ``write``."""
        if not (isinstance(self.turn_signals(), RedisTurnSignals) and self._plain_commit()):
            return super().commit_turn(session_id, base, outcome, state, position)
        record = base.advance(outcome, state, position)
        self._write(session_id, record, base.version, outcome.request_id)
        return record

    def _plain_commit(self) -> bool:
        cls = type(self)
        return cls.commit is SessionStore.commit and cls.write is RedisSessionStore.write

    def _write(
        self, session_id: str, record: SessionRecord, expected_version: int, closing: str | None
    ) -> None:
        """The compare-and-set of ``write``; ``closing``: also close that turn of the session."""
        doc = record.encode()
        args: list[str | int] = [expected_version, record.version, doc, self._ttl_ms, "", "", ""]
        keys = [self._key(session_id)]
        if (scope := scope_of(session_id, record.owner)) is not None:
            keys.append(self._index_key(scope))
            args[4:6] = [now_ms(), session_id]
        if closing is not None:
            keys += [open_key(self._prefix, session_id), turn_key(self._prefix, closing)]
            args[6] = closing
        with _errors(f"write of session {session_id}"):
            found = int(self._cas(keys=keys, args=args))
        if found != -1:
            raise StaleSessionError(
                f"session {session_id} is at version {found}, not {expected_version}"
            )

    def list_sessions(
        self, scope: str, limit: int, after: SessionEntry | None = None
    ) -> SessionPage:
        key, oldest = self._index_key(scope), f"({now_ms() - self._ttl_ms}"
        top: str | int = "+inf" if after is None else after.active_at
        with _errors(f"listing of the sessions of {scope}"):
            # entries at the cursor's own time may come before it: fetch them too, then skip
            ties = 0 if after is None else int(self._redis.zcount(key, top, top))
            found = self._redis.zrevrangebyscore(
                key, top, oldest, start=0, num=limit + 1 + ties, withscores=True
            )
        entries = [SessionEntry(_text(pair[0]), int(pair[1])) for pair in found]
        return page_of(entries, limit, after)

    def delete(self, session_id: str) -> None:
        keys = [self._key(session_id), self._index_key(scope_of(session_id, None) or "")]
        with _errors(f"erase of session {session_id}"):
            self._delete(keys=keys, args=[session_id])

    def _new_turn_signals(self, stale_after: float) -> TurnSignals:
        return RedisTurnSignals(self._redis, self._prefix, stale_after=stale_after)

    def ping(self) -> None:
        with _errors("ping of the session store"):
            self._guard.probe()

    def warnings(self) -> list[str]:
        return list(self._guard.warnings)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
