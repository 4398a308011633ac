#!lua name=floor_pipeline
-- floor:pipeline, a candidate for protocol v2, as a Function library
-- (loaded once with FUNCTION LOAD REPLACE, called with FCALL). One record
-- per lease: a member token|acq|fence of the leases zset, scored by its
-- deadline (ms, Redis's TIME). A registered waiter is a member acq of the
-- same zset (no '|'), scored by when it may be swept, so that one range
-- finds both what crashed holders and dead waiters left.
--
-- Acquire, when the client expects the lock free: one FCALL of
-- pipeline_acquire. When it expects to wait (its last acquisition waited),
-- or when pipeline_acquire answered "wait": ONE write of
--   FCALL pipeline_register; BLMOVE tokens pend:<acq> LEFT RIGHT <ttl s>;
--   FCALL pipeline_record
-- (without the first when pipeline_acquire already registered). Release:
-- FCALL pipeline_release. A waiter blocks for at most a lease's ttl, so a
-- crashed holder's token comes back within two ttls, swept by whoever
-- registers next. Nothing else of redsem's: no fence across data loss, no
-- argument, type or memory checks, no resize. The sweep touches pending
-- lists it is not given as keys: one Redis, not a cluster.

-- Registrations may be swept this long (ms) after their wait would have
-- timed out.
local grace = 5000

-- now returns Redis's TIME in ms, and in µs as a string (the fence).
local function now()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000), t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- sweep gives back what expired by ms (16 at most a call): the token of a
-- lease, and whatever token a BLMOVE moved onto the pending list of a
-- registered waiter whose record never ran.
local function sweep(tokens, leases, ms)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', ms, 'LIMIT', 0, 16)) do
    local tok = string.match(m, '^([^|]*)|')
    if tok then
      redis.call('LPUSH', tokens, tok)
    else
      redis.call('LMOVE', tokens .. ':pend:' .. m, tokens, 'LEFT', 'LEFT')
    end
    redis.call('ZREM', leases, m)
  end
end

-- pipeline_acquire takes a free token and records its lease; with none
-- free, it sweeps, registers the acquisition and answers "wait" (the
-- client then writes BLMOVE and pipeline_record). Returns {token, fence},
-- or 0 (registered: wait).
redis.register_function('pipeline_acquire', function(keys, args)
  local tokens, leases = keys[1], keys[2]
  local acq, ttl = args[1], args[2]

  local ms, fence = now()
  local tok = redis.call('LPOP', tokens)
  if tok then
    redis.call('ZADD', leases, ms + ttl, tok .. '|' .. acq .. '|' .. fence)
    return {tok, fence}
  end
  sweep(tokens, leases, ms) -- a token swept back is the BLMOVE's at once
  redis.call('ZADD', leases, ms + ttl + grace, acq)
  return 0
end)

-- pipeline_register, first of the waiting write: sweeps and registers the
-- acquisition. Returns TIME in µs, which the client compares with the
-- fence pipeline_record returns to tell whether the BLMOVE between blocked.
redis.register_function('pipeline_register', function(keys, args)
  local tokens, leases = keys[1], keys[2]
  local acq, ttl = args[1], args[2]

  local ms, us = now()
  sweep(tokens, leases, ms)
  redis.call('ZADD', leases, ms + ttl + grace, acq)
  return us
end)

-- pipeline_record, last of the waiting write (behind the BLMOVE): pops the
-- token the BLMOVE moved, records its lease and takes the registration
-- out. Returns {token, fence}, or 0 if the BLMOVE timed out.
redis.register_function('pipeline_record', function(keys, args)
  local pend, leases = keys[1], keys[2]
  local acq, ttl = args[1], args[2]

  local tok = redis.call('LPOP', pend)
  if not tok then
    redis.call('ZREM', leases, acq)
    return 0
  end
  local ms, fence = now()
  redis.call('ZADD', leases, ms + ttl, tok .. '|' .. acq .. '|' .. fence)
  redis.call('ZREM', leases, acq)
  return {tok, fence}
end)

-- pipeline_release: the ZREM of the lease's member is the owner check.
-- Returns 1 if the lease was there (the token went back), else 0.
redis.register_function('pipeline_release', function(keys, args)
  local tokens, leases = keys[1], keys[2]
  local lease, tok = args[1], args[2]

  if redis.call('ZREM', leases, lease) == 0 then return 0 end
  redis.call('LPUSH', tokens, tok)
  return 1
end)
