-- rate_common.lua: helpers of the RateGate scripts, placed after common.lua
-- by scripts.go. It defines helpers only; nothing here writes until
-- a script calls it.
--
-- Key layout of a RateGate (one hash tag; base = <prefix>{<name>}:rate:):
--   KEYS[1] meta     hash  size (n), per (µs), epoch, fence, rejected, created,
--                          timer (acqID of the queue head that keeps time)
--   KEYS[2] tokens   list  free start tokens "<epoch>:<slot>"
--   KEYS[3] leases   zset  token -> when it comes back: grant + per, µs of Redis TIME
--   KEYS[4] holders  hash  "t:"..token -> "acqID|grantUs", "a:"..acqID -> token
--   KEYS[5] queue    list  acqIDs of blocked waiters, oldest first
--   KEYS[6] waits    zset  "w:"..acqID -> liveness deadline (µs) of a queued or
--                          served waiter, "x:"..acqID -> tombstone deadline
--   KEYS[7] inbox    list  base.."in:"..acqID, the doorbell a waiter BLPOPs on
-- A start token is granted by recording it in leases; it is never given back
-- early: it returns to the free list when Redis TIME reaches its score. So two
-- grants of one token are at least per apart, and any n+1 grants span at
-- least per (two of them share a token).
--
-- common.lua's helpers used here: now_us, int_arg, fmt_int, type_err,
-- is_valid, owner_of, base, give_back (KEYS[1..3] mean the same here).

local function check_rate_types()
  local want = {'hash', 'list', 'zset', 'hash', 'list', 'zset', 'list'}
  for i = 1, 7 do
    local e = type_err(KEYS[i], want[i])
    if e then return e end
  end
  return nil
end

local function inbox_of(acq)
  return base() .. 'in:' .. acq
end

-- rate_state reads meta into {n, per, epoch, fence}; nil when the gate does
-- not exist; nil, err when meta is unusable.
local function rate_state()
  local m = redis.call('HMGET', KEYS[1], 'size', 'per', 'epoch', 'fence')
  if not m[1] and not m[3] then return nil, nil end
  local n, per, fence = tonumber(m[1]), tonumber(m[2]), tonumber(m[4])
  if not n or n < 1 or not per or not m[3] or not fence then
    return nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' is not a redsem rate gate record'
  end
  if fence >= FENCE_MAX then
    return nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' holds grant time ' .. m[4] .. ', too large to grow'
  end
  return {n = n, per = per, epoch = m[3], fence = fence}, nil
end

-- sweep forgets waiters whose liveness deadline passed (their client died or
-- was cut off) and expired tombstones.
local function sweep(now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, 100)
  for _, m in ipairs(dead) do
    redis.call('ZREM', KEYS[6], m)
    if string.sub(m, 1, 2) == 'w:' then
      local acq = string.sub(m, 3)
      redis.call('LREM', KEYS[5], 0, acq)
      redis.call('DEL', inbox_of(acq))
      if redis.call('HGET', KEYS[1], 'timer') == acq then
        redis.call('HDEL', KEYS[1], 'timer')
      end
    end
  end
end

-- return_due puts back on the free list every token whose time has come.
local function return_due(st, now)
  local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
  for _, tok in ipairs(due) do
    redis.call('ZREM', KEYS[3], tok)
    local rec = redis.call('HGET', KEYS[4], 't:' .. tok)
    if rec then
      redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. (owner_of(rec) or ''))
    end
    give_back(tok, st.epoch, st.n)
  end
end

-- pop_token returns a free valid token, dropping (and counting) anything else.
local function pop_token(st)
  for _ = 1, 1000 do
    local tok = redis.call('LPOP', KEYS[2])
    if not tok then return nil end
    if is_valid(tok, st.epoch, st.n) and not redis.call('ZSCORE', KEYS[3], tok) then
      return tok
    end
    redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  end
  return nil
end

-- grant records tok as a start of acq at Redis time now (or just after the
-- last grant, so grant times strictly increase) and returns the grant time.
local function grant(st, acq, tok, now)
  local g = math.max(st.fence + 1, now)
  st.fence = g
  redis.call('ZADD', KEYS[3], fmt_int(g + st.per), tok)
  redis.call('HSET', KEYS[1], 'fence', fmt_int(g))
  redis.call('HSET', KEYS[4], 't:' .. tok, acq .. '|' .. fmt_int(g), 'a:' .. acq, tok)
  return g
end

-- ring wakes acq's BLPOP. The inbox of another waiter may not have been
-- type-checked: one of the wrong type is left alone (that waiter wakes at
-- its next timeout anyway).
local function ring(acq)
  redis.pcall('RPUSH', inbox_of(acq), 1)
end

-- serve grants free tokens to queued waiters, oldest first, ringing each
-- one's doorbell, then makes sure the new head of the queue knows that it
-- keeps time (wakes at the earliest token return) by ringing it too.
local function serve(st, now)
  for _ = 1, 1000 do
    local head = redis.call('LINDEX', KEYS[5], 0)
    if not head then break end
    local tok = pop_token(st)
    if not tok then break end
    redis.call('LPOP', KEYS[5])
    grant(st, head, tok, now)
    ring(head)
  end
  local head = redis.call('LINDEX', KEYS[5], 0)
  if head and redis.call('HGET', KEYS[1], 'timer') ~= head then
    redis.call('HSET', KEYS[1], 'timer', head)
    ring(head)
  end
end

-- next_in is how long from now until another start may be possible: 0 while
-- a token is free and nobody queues, else until the earliest token return.
local function next_in(st, now)
  if redis.call('LLEN', KEYS[5]) == 0 and redis.call('LLEN', KEYS[2]) > 0 then
    return 0
  end
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[2] then return math.max(tonumber(first[2]) - now, 1) end
  return st.per
end

-- granted_reply is the reply for a start of acq that Redis records, or nil.
local function granted_reply(st, acq, now)
  local tok = redis.call('HGET', KEYS[4], 'a:' .. acq)
  if not tok then return nil end
  local rec = redis.call('HGET', KEYS[4], 't:' .. tok)
  if not rec or owner_of(rec) ~= acq or not redis.call('ZSCORE', KEYS[3], tok) then
    return nil
  end
  local g = tonumber(string.match(rec, '|(%d+)$'))
  return {GRANTED, tok, g, next_in(st, now), now}
end
