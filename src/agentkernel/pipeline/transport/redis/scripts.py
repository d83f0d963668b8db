"""The Lua scripts of the Redis Streams transport: each state change is one atomic script.

The invariant they keep: a session whose stream holds messages has exactly one token, either
unread in the ready stream or pending (leased) in the consumer group; a session with no
messages has none. The token's pending-entries delivery counter is the receive count of the
session's head message, since a fresh token is added for every new head.

Scripts that resolve tokens build session keys from the tag they are given (``ARGV``), not
from ``KEYS``: the sessions are only known once the tokens are read. Every such key carries
the queue's hash tag, so it is in the slot of the declared keys.
"""

from __future__ import annotations

#: XAUTOCLAIM calls per fetch at most (each scans up to ten times the batch size).
CLAIM_ROUNDS = 10

#: Whether the caller (consumer, delivery count) still holds a token; stale handles do nothing.
_OWNED = """
local function owned(ready, group, consumer, token, count)
  local p = redis.call('XPENDING', ready, group, token, token, 1)
  return #p == 1 and p[1][2] == consumer and tonumber(p[1][4]) == tonumber(count)
end
"""

#: Drop the token and the head; hand the session on to its next message, if any.
_RELEASE = """
local function release(ready, group, token, session_key, head, session)
  redis.call('XACK', ready, group, token)
  redis.call('XDEL', ready, token)
  redis.call('XDEL', session_key, head)
  if redis.call('XLEN', session_key) > 0 then
    redis.call('XADD', ready, '*', 's', session)
  else
    redis.call('DEL', session_key)
  end
end
"""

#: Look up the head message of each token; a token with no message is dropped.
_RESOLVE = """
local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end

local function resolve(ready, group, tag, tokens, fresh)
  local out = {}
  for i, entry in ipairs(tokens) do
    local token, fields = entry[1], entry[2]
    local session = fields and field(fields, 's')
    local head = nil
    if session then
      local ok, got = pcall(redis.call, 'XRANGE', tag .. ':s:' .. session, '-', '+', 'COUNT', 1)
      if ok and #got == 1 then head = got[1] end
    end
    if head then
      local count = 1  -- a token read as new has been delivered once
      if i <= #tokens - fresh then
        count = redis.call('XPENDING', ready, group, token, token, 1)[1][4]
      end
      table.insert(out, {token, session, count, head[1], head[2]})
    else
      redis.call('XACK', ready, group, token)
      redis.call('XDEL', ready, token)
      table.insert(out, {token, session or false, 0})
    end
  end
  return out
end
"""

#: KEYS: ready, meta, session stream, dedup marker.
#: ARGV: session, body, attributes, dedup id ('' for none), window ms, incarnation id (used by
#: the queue's first message), ungrouped.
SEND = """
if ARGV[4] ~= '' and not redis.call('SET', KEYS[4], '1', 'NX', 'PX', ARGV[5]) then
  return false
end
local n = redis.call('HINCRBY', KEYS[2], 'seq', 1)
if n == 1 then redis.call('HSET', KEYS[2], 'inc', ARGV[6]) end
local fields = {'n', n, 'b', ARGV[2], 'a', ARGV[3]}
if ARGV[4] ~= '' then table.insert(fields, 'd'); table.insert(fields, ARGV[4]) end
if ARGV[7] == '1' then table.insert(fields, 'u'); table.insert(fields, '1') end
redis.call('XADD', KEYS[3], '*', unpack(fields))
if redis.call('XLEN', KEYS[3]) == 1 then redis.call('XADD', KEYS[1], '*', 's', ARGV[1]) end
return n
"""

#: KEYS: ready, meta. ARGV: group, consumer, count, lease ms, claim cursor, tag.
#: Returns {next cursor, incarnation, resolved tokens}. The claim goes on from the cursor of the
#: consumer's previous fetch, so a large pending list is scanned over a few fetches.
FETCH = (
    _RESOLVE
    + f"local CLAIM_ROUNDS = {CLAIM_ROUNDS}\n"
    + """
local tokens, cursor = {}, ARGV[5]
for _ = 1, CLAIM_ROUNDS do  -- each round scans up to ten times COUNT pending entries
  local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[4], cursor,
    'COUNT', tonumber(ARGV[3]) - #tokens)
  cursor = claimed[1]
  for _, entry in ipairs(claimed[2]) do table.insert(tokens, entry) end
  if cursor == '0-0' or #tokens >= tonumber(ARGV[3]) then break end
end
local fresh = 0
local want = tonumber(ARGV[3]) - #tokens
if want > 0 then
  local got = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want,
    'STREAMS', KEYS[1], '>')
  if got then
    for _, entry in ipairs(got[1][2]) do table.insert(tokens, entry) end
    fresh = #got[1][2]
  end
end
return {cursor, redis.call('HGET', KEYS[2], 'inc') or '',
  resolve(KEYS[1], ARGV[1], ARGV[6], tokens, fresh)}
"""
)

#: Tokens a blocking read delivered (as new: each was delivered once). KEYS: ready, meta.
#: ARGV: group, tag, then per token its id, '1' if it names a session ('0': it names none, not
#: even the empty one), the session. Returns {incarnation, resolved tokens}.
RESOLVE = (
    _RESOLVE
    + """
local tokens = {}
for i = 3, #ARGV, 3 do
  table.insert(tokens, {ARGV[i], ARGV[i + 1] == '1' and {'s', ARGV[i + 2]} or {}})
end
return {redis.call('HGET', KEYS[2], 'inc') or '',
  resolve(KEYS[1], ARGV[1], ARGV[2], tokens, #tokens)}
"""
)

#: KEYS: ready, session stream. ARGV: group, consumer, token, count, head, session.
ACK = (
    _OWNED
    + _RELEASE
    + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
release(KEYS[1], ARGV[1], ARGV[3], KEYS[2], ARGV[5], ARGV[6])
return 1
"""
)

#: KEYS: ready, session stream, dlq. ARGV: group, consumer, token, count, head, session,
#: reason, dlq max length. The dead letter keeps the entry's fields as they were.
DEAD_LETTER = (
    _OWNED
    + _RELEASE
    + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
local entry = redis.call('XRANGE', KEYS[2], ARGV[5], ARGV[5])
if #entry == 1 then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'session', ARGV[6],
    'id', ARGV[5], 'receive_count', ARGV[4], 'reason', ARGV[7], unpack(entry[1][2]))
end
release(KEYS[1], ARGV[1], ARGV[3], KEYS[2], ARGV[5], ARGV[6])
return 1
"""
)

#: Set how long ago the token counts as delivered: 0 restarts its lease, the lease makes it
#: claimable at once (nack), in between delays its redelivery. JUSTID: no delivery is counted.
#: KEYS: ready. ARGV: group, consumer, token, count, idle ms.
SET_IDLE = (
    _OWNED
    + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[5], 'JUSTID')
return 1
"""
)

#: A closing consumer hands its tokens to the parking consumer, claimable at once, and leaves
#: the group (deleting a consumer deletes its pending entries, hence the hand-over first).
#: KEYS: ready. ARGV: group, consumer, parking consumer, lease ms.
LEAVE = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 100000, ARGV[2])
for _, p in ipairs(pending) do
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, p[1], 'IDLE', ARGV[4], 'JUSTID')
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return #pending
"""

#: Delete consumers that hold nothing and were not seen for ARGV[2] ms (crashed processes):
#: safe even for a live one, which the next read re-creates. KEYS: ready. ARGV: group, idle ms.
PRUNE = """
local gone = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if tonumber(info['pending']) == 0 and tonumber(info['idle']) > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    gone = gone + 1
  end
end
return gone
"""
