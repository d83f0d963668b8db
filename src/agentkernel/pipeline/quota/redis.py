"""The per-identity quota ledger in Redis, shared by every IO process using the Redis store.

Per identity, beside the replies (``<prefix>quota:<identity>:...``): a sorted set of unread
request ids scored by expiry, a sorted set of stored-bytes keys scored by expiry, a hash of their
sizes and a running total. Each call is one Lua script (expired entries are dropped, the caps
checked and the entry written atomically), and every key expires with the TTL, so an identity
that goes quiet leaves nothing behind.
"""

from __future__ import annotations

import functools
import time

import redis

from agentkernel.core.errors import ResponseStoreError, StoreUnavailableError
from agentkernel.core.redis_errors import redis_errors
from agentkernel.pipeline.quota import Quota, QuotaLedger

__all__ = ["RedisQuotaLedger"]

_errors = functools.partial(
    redis_errors, unavailable=StoreUnavailableError, failed=ResponseStoreError, unreadable=True
)

# KEYS: unread zset, bytes zset, sizes hash, total. ARGV: now ms, ttl ms, then per script.
_EXPIRE_BYTES = """
local function expire_bytes(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, key in ipairs(gone) do
    redis.call('DECRBY', KEYS[4], tonumber(redis.call('HGET', KEYS[3], key) or '0'))
    redis.call('HDEL', KEYS[3], key)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
end
local function keep(ttl)
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
"""

# ARGV[3] request id, ARGV[4] max unread (-1: off), ARGV[5] max bytes (-1: off).
# Returns -1 when admitted, else ms until the oldest entry holding the cap ends.
_ADMIT = (
    _EXPIRE_BYTES
    + """
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
expire_bytes(now)
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  local max_unread, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
  if max_unread >= 0 and redis.call('ZCARD', KEYS[1]) >= max_unread then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return tonumber(oldest[2]) - now
  end
  if max_bytes >= 0 and tonumber(redis.call('GET', KEYS[4]) or '0') >= max_bytes then
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return tonumber(oldest[2]) - now
  end
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
keep(ttl)
return -1
"""
)

# ARGV[3] key, ARGV[4] size: replaces the key's size (a redelivered reply is not counted twice).
_STORED = (
    _EXPIRE_BYTES
    + """
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
expire_bytes(now)
local old = tonumber(redis.call('HGET', KEYS[3], ARGV[3]) or '0')
redis.call('INCRBY', KEYS[4], tonumber(ARGV[4]) - old)
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[3])
keep(ttl)
return 1
"""
)


class RedisQuotaLedger(QuotaLedger):
    """Quota counts on the Redis server of the response store.

    Args:
        client: the store's Redis client.
        prefix: the store's key prefix.
        ttl: the store's TTL, in seconds.
    """

    def __init__(self, client: redis.Redis, prefix: str, ttl: float) -> None:
        super().__init__(ttl)
        self._redis, self._prefix = client, prefix
        self._admit = client.register_script(_ADMIT)
        self._stored = client.register_script(_STORED)

    def admit(self, owner: str, request_id: str, quota: Quota) -> float | None:
        caps = [-1 if cap is None else cap for cap in (quota.unread_turns, quota.reply_bytes)]
        with _errors(f"quota check of {request_id}"):
            wait = int(self._admit(keys=self._keys(owner), args=[*self._now(), request_id, *caps]))
        return None if wait < 0 else wait / 1000

    def read(self, owner: str, request_id: str) -> None:
        with _errors(f"quota release of {request_id}"):
            self._redis.zrem(self._keys(owner)[0], request_id)

    def stored(self, owner: str, key: str, size: int) -> None:
        with _errors(f"quota count of {key}"):
            self._stored(keys=self._keys(owner), args=[*self._now(), key, size])

    def _keys(self, owner: str) -> list[str]:
        base = f"{self._prefix}quota:{owner}:"
        return [base + "unread", base + "bytes", base + "sizes", base + "total"]

    def _now(self) -> list[int]:
        return [int(time.time() * 1000), max(1, int(self.ttl * 1000))]
