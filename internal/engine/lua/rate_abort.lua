-- rate_abort.lua: settle a RateGate acquisition whose reply the client could
-- not read (cancelled context, dropped connection, read timeout) or that it
-- gives up while queued.
-- KEYS: meta, tokens, leases, holders, queue, waits, inbox (see rate_common.lua)
-- ARGV: acqID, mode ("release" or "resolve"), tombUs
-- If Redis granted the acquisition a start: mode "resolve" keeps it and
-- returns {1, token, grantUs, nextUs, nowUs} as rate_take.lua does; mode
-- "release" gives the token back at once (the client never learnt of the
-- start, so nothing started) and returns {3, 0, nowUs}. Otherwise the waiter
-- leaves the queue, a tombstone stops a late rate_take.lua of it from
-- queueing or taking anything, and it returns {0, 0, nowUs}.

local acq, mode, tomb = ARGV[1], ARGV[2], int_arg(ARGV[3], 0, 1e12)
if not tomb or (mode ~= 'release' and mode ~= 'resolve') then
  return redis.error_reply('REDSEM_ARG invalid arguments to rate_abort')
end
local err = check_rate_types()
if err then return redis.error_reply(err) end
local now = now_us()
local st
st, err = rate_state()
if err then return redis.error_reply(err) end

local released = false
if st then
  local r = granted_reply(st, acq, now)
  if r and mode == 'resolve' then
    redis.call('ZREM', KEYS[6], 'w:' .. acq)
    redis.call('DEL', KEYS[7])
    return r
  end
  if r then
    released = true
    redis.call('ZREM', KEYS[3], r[2])
    redis.call('HDEL', KEYS[4], 't:' .. r[2], 'a:' .. acq)
    give_back(r[2], st.epoch, st.n)
  end
end
redis.call('LREM', KEYS[5], 0, acq)
redis.call('ZREM', KEYS[6], 'w:' .. acq)
redis.call('ZADD', KEYS[6], fmt_int(now + tomb), 'x:' .. acq)
redis.call('DEL', KEYS[7])
if redis.call('HGET', KEYS[1], 'timer') == acq then
  redis.call('HDEL', KEYS[1], 'timer')
end
if st then
  -- Hand a given-back token to the next waiter, and wake a new head.
  return_due(st, now)
  serve(st, now)
  if released then return {RELEASED, 0, now} end
end
return {WAITING, 0, now}
