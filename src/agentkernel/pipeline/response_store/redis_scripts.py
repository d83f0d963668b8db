"""The Lua scripts of the Redis response store: each atomic write in one round trip.

Each script's comment names its ``KEYS`` and ``ARGV``; :mod:`~.response_store.redis` registers
them once per client and passes those in that order.
"""

__all__ = ["ACCEPT", "APPEND_CHUNKS", "PUT"]

# Appends frames ARGV[3..], numbered from ARGV[1] on, each only when it is the next index (a
# redelivered chunk is ignored); when any was new, renews the list's expiry (ARGV[2] ms) and
# wakes the waiters of every IO process through the reply channel. Returns how many were new.
APPEND_CHUNKS = """
local kept = redis.call('LLEN', KEYS[1])
local first = tonumber(ARGV[1])
local added = 0
for i = 3, #ARGV do
  if first + i - 3 == kept then
    redis.call('RPUSH', KEYS[1], ARGV[i])
    kept = kept + 1
    added = added + 1
  end
end
if added > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PUBLISH', KEYS[2], '1')
end
return added
"""

# Writes reply ARGV[1] for ARGV[2] ms, adds its request id ARGV[3] to its session's set (KEYS[2]),
# and wakes the waiters of every IO process with ARGV[4] (the reply itself, or '1'). A script
# rather than a MULTI pipeline: as atomic, one command to send and one answer to read.
PUT = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PUBLISH', KEYS[3], ARGV[4])
return 1
"""

# Keeps ticket ARGV[1] unless one is kept already; returns the kept one (first wins). A missing
# ticket while the epoch KEYS[2] is not ARGV[3] (or misses are refused: ARGV[4]) returns 0.
ACCEPT = """
local kept = redis.call('GET', KEYS[1])
if kept then return kept end
if ARGV[4] == '1' or redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return false
"""
