"""Turn signals in Redis, beside the sessions (:class:`RedisSessionStore`'s client and prefix).

Two kinds of key::

    <prefix>open:<session key>   sorted set: the session's open turns, each scored by when it
                                 was opened (microseconds of the server's clock); expires
                                 stale_after seconds after the latest open or start
    <prefix>turn:<request id>    string: "started <session key>" while the turn runs, or the
                                 stop asked for it (JSON, always starting with "{"), which then
                                 replaces the mark; expires stale_after (started) or ttl
                                 (stopped) seconds after it was written

Each step is one Lua script or one pipelined round trip: ``open`` (exclusive or not) prunes the
stale entries, reads the others and adds the turn in one script; ``stop`` and the first half of
``start`` are compare-and-sets on the turn's one key, so a ``SUPERSEDE`` and a ``start`` racing
for the same turn have exactly one winner; ``stops`` is one ``MGET``; ``close`` removes the
turn's entry and deletes its key in one pipeline (a closed turn's outcome is committed, so its
stop is no longer needed). The runner's close usually runs inside the session store's commit
script instead (:meth:`RedisSessionStore.commit_turn`), through :func:`open_key` and
:func:`turn_key`. A cancel that comes after that close and before the reply is stored leaves its
stop behind, until ``ttl``: nothing reads it (the turn is committed).

Every script but ``start`` touches one key. ``start`` touches the turn's key and its session's
set, which on Redis Cluster would have to share a hash slot; the session store's own commit (the
record and its identity's index) has the same need, so sessions and their signals run on one
Redis (with replicas if wanted), not on a Cluster.

redis-py exceptions are mapped as the session store maps them: connection trouble is
:class:`SessionStoreUnavailableError`, a full server :class:`StoreFullError`, anything else
:class:`SessionStoreError`.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import TYPE_CHECKING

from agentkernel.core.errors import SessionStoreError, SessionStoreUnavailableError, StoreFullError
from agentkernel.core.redis_errors import redis_errors
from agentkernel.pipeline.turn_control.signals import (
    STALE_AFTER_SECONDS,
    Stop,
    StopKind,
    TurnSignals,
)

if TYPE_CHECKING:
    import redis

__all__ = ["RedisTurnSignals", "open_key", "turn_key"]

_errors = functools.partial(
    redis_errors,
    unavailable=SessionStoreUnavailableError,
    failed=SessionStoreError,
    full=StoreFullError,
)

# The server's clock in microseconds, and the open turns of KEYS[1] older than ARGV[1] us
# dropped. Numbers go to Redis as formatted integers (Lua would print 1.7e+15).
_NOW_AND_PRUNE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - tonumber(ARGV[1])))
"""

# KEYS: the session's open set. ARGV: stale_after (us), request id, '1' for exclusive.
# Returns the other open turns, oldest first; with exclusive and others, adds nothing.
_OPEN = (
    _NOW_AND_PRUNE
    + """
local others = {}
for _, rid in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if rid ~= ARGV[2] then others[#others + 1] = rid end
end
if ARGV[3] == '1' and #others > 0 then return others end
redis.call('ZADD', KEYS[1], 'NX', string.format('%.0f', now), ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) / 1000))
return others
"""
)

# KEYS: the session's open set, the turn's key. ARGV: stale_after (us), request id, the started
# mark. Returns the stop held for the turn (then nothing is written), else marks it started and
# opens it if it was not open.
_START = (
    """
local held = redis.call('GET', KEYS[2])
if held and string.sub(held, 1, 1) == '{' then return held end
"""
    + _NOW_AND_PRUNE
    + """
local ms = math.ceil(tonumber(ARGV[1]) / 1000)
redis.call('SET', KEYS[2], ARGV[3], 'PX', ms)
redis.call('ZADD', KEYS[1], 'NX', string.format('%.0f', now), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ms)
return false
"""
)

# KEYS: the turn's key. ARGV: the stop, ttl (ms), the started mark a SUPERSEDE is refused by
# ('' for any other stop). Returns the stop that holds, or nothing when refused.
_STOP = """
local held = redis.call('GET', KEYS[1])
if held then
  if string.sub(held, 1, 1) == '{' then return held end
  if ARGV[3] ~= '' and held == ARGV[3] then return false end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""


class RedisTurnSignals(TurnSignals):
    """Turn signals in the Redis of a :class:`RedisSessionStore` (layout in the module
    docstring).

    Args:
        client: the session store's redis-py client.
        prefix: the session store's key prefix.
        ttl: seconds a stop request is kept.
        stale_after: seconds an open turn that was never closed keeps counting as open.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        ttl: float = 86400.0,
        stale_after: float = STALE_AFTER_SECONDS,
    ) -> None:
        super().__init__(ttl, stale_after)
        self._redis, self._prefix = client, prefix
        self._stale_us = max(1, int(stale_after * 1_000_000))
        self._ttl_ms = max(1, int(ttl * 1000))
        self._open = client.register_script(_OPEN)
        self._start = client.register_script(_START)
        self._stop = client.register_script(_STOP)

    def _open_key(self, key: str) -> str:
        return open_key(self._prefix, key)

    def _turn_key(self, request_id: str) -> str:
        return turn_key(self._prefix, request_id)

    def open(self, key: str, request_id: str, *, exclusive: bool = False) -> list[str]:
        args: list[str | int] = [self._stale_us, request_id, "1" if exclusive else "0"]
        with _errors(f"open of turn {request_id}"):
            others = self._open(keys=[self._open_key(key)], args=args)
        return [_text(rid) for rid in others]

    def stop(self, key: str, request_id: str, stop: Stop) -> Stop | None:
        refused_by = _started(key) if stop.kind is StopKind.SUPERSEDE else ""
        args: list[str | int] = [stop.encode(), self._ttl_ms, refused_by]
        with _errors(f"stop of turn {request_id}"):
            held = self._stop(keys=[self._turn_key(request_id)], args=args)
        return None if held is None else Stop.decode(held)

    def start(self, key: str, request_id: str) -> Stop | None:
        keys = [self._open_key(key), self._turn_key(request_id)]
        with _errors(f"start of turn {request_id}"):
            held = self._start(keys=keys, args=[self._stale_us, request_id, _started(key)])
        return None if held is None else Stop.decode(held)

    def stops(self, request_ids: Collection[str]) -> dict[str, Stop]:
        ids = list(request_ids)
        if not ids:
            return {}
        with _errors(f"read of the stops of {len(ids)} turns"):
            found = self._redis.mget([self._turn_key(rid) for rid in ids])
        return {
            rid: Stop.decode(value)
            for rid, value in zip(ids, found, strict=True)
            if value is not None and _text(value).startswith("{")
        }

    def close(self, key: str, request_id: str) -> None:
        with _errors(f"close of turn {request_id}"), self._redis.pipeline(False) as pipe:
            pipe.zrem(self._open_key(key), request_id)
            pipe.delete(self._turn_key(request_id))
            pipe.execute()

    def forget_session(self, key: str) -> None:
        with _errors(f"erase of the open turns of session {key}"):
            turns = self._redis.zrange(self._open_key(key), 0, -1)
            self._redis.delete(self._open_key(key), *(self._turn_key(_text(r)) for r in turns))

    def ping(self) -> None:
        with _errors("ping of the turn signals"):
            self._redis.ping()


def open_key(prefix: str, key: str) -> str:
    """The key of the open turns of the session at ``key``, under the store's ``prefix``."""
    return f"{prefix}open:{key}"


def turn_key(prefix: str, request_id: str) -> str:
    """The key of turn ``request_id``'s mark or stop, under the store's ``prefix``."""
    return f"{prefix}turn:{request_id}"


def _started(key: str) -> str:
    """The mark a started turn of the session at ``key`` leaves on its key."""
    return f"started {key}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
