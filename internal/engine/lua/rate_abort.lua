-- rate_abort.lua: settle an acquisition of a gate whose reply the client
-- could not read (cancelled context, dropped connection, read timeout) or
-- that it gives up while queued.
-- KEYS: meta, holders, queue, waits, log1, log2, log3, log4, inbox (see rate_common.lua)
-- ARGV: acqID, mode ("release" or "resolve"), tombUs
-- If Redis granted the acquisition a start: mode "resolve" keeps it and
-- returns {1, grantUs, nextUs, nowUs} as rate_take.lua does; mode "release"
-- takes its units out of the windows at once (the client never learnt of
-- the start, so nothing started) and returns {3, 0, nowUs}. Otherwise the
-- waiter leaves the queue, a tombstone stops a late rate_take.lua of it
-- from queueing or taking anything, and it returns {0, 0, nowUs}.

local acq, mode, tomb = ARGV[1], ARGV[2], int_arg(ARGV[3], 0, 1e12)
if not tomb or (mode ~= 'release' and mode ~= 'resolve') then
  return redis.error_reply('REDSEM_ARG invalid arguments to rate_abort')
end
local err = check_rate_types(meta_key, holders_key, queue_key, waits_key, log1_key, log2_key, log3_key, log4_key, inbox_key)
if err then return redis.error_reply(err) end
local now = now_us()
local st
st, err = rate_state()
if err then return redis.error_reply(err) end

local released = false
if st then
  local g, w = grant_of(acq, st.L)
  if g and mode == 'resolve' then
    redis.call('ZREM', waits_key, 'w:' .. acq)
    redis.call('DEL', inbox_key)
    local r = {GRANTED, g, wait_for(st, w, now), now}
    forget(st, acq)
    settle_idle(st, now)
    return r
  end
  if g then
    released = true
    local all = true
    for i = 1, st.L do
      if w[i] > 0 and not refund(st, i, acq, w[i], g) then all = false end
    end
    -- A grant still logged keeps its record until its window ends.
    if all then redis.call('HDEL', holders_key, 'g:' .. acq) end
  end
end
redis.call('LREM', queue_key, 0, acq)
redis.call('HDEL', holders_key, 'r:' .. acq)
redis.call('ZREM', waits_key, 'w:' .. acq)
redis.call('ZADD', waits_key, fmt_int(now + tomb), 'x:' .. acq)
redis.call('DEL', inbox_key)
if released or redis.call('HGET', meta_key, 'timer') == acq then
  -- Given-back units may bring the head's turn closer: serve rings it
  -- (as a new head) to time its wake-up again.
  redis.call('HDEL', meta_key, 'timer')
end
if st then
  -- Hand given-back units to the waiters, and wake a new head.
  expire(st, now)
  serve(st, now)
  settle_idle(st, now)
  if released then return {RELEASED, 0, now} end
  return {WAITING, 0, now}
end
-- No gate (never made, or its keys expired): waits holds tombstones only,
-- which expire with the last of them.
local last = redis.call('ZRANGE', waits_key, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', waits_key, fmt_int(math.ceil(tonumber(last[2]) / 1000)))
return {WAITING, 0, now}
