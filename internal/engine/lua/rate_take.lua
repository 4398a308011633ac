-- rate_take.lua: Wait, WaitN and Allow of a gate or quota on the server.
-- Runs alone (phase "fresh", a call's first script) or right behind the
-- waiter's
--   BLPOP <inbox> <timeout>
-- in the same write (phase "wait"), or after the queue head slept until
-- its request fits.
--
-- KEYS: meta, holders, queue, waits, log1, log2, log3, log4, inbox (see rate_common.lua)
-- ARGV: acqID, blockUs (the longest the client lets one wait last; 0: never
--       wait), graceUs, tombUs, phase ("fresh" or "wait"), idleMs (the idle
--       expiry, 0: off; rate_idle.lua), limits (L), then
--       for each limit: n, perUs, units (what this start takes of it; not all 0)
-- Returns one of
--   {1, grantUs, nextUs, nowUs}  granted: a start at Redis time grantUs;
--                                another as large may start in nextUs
--   {0, waitUs, nowUs, head}     not granted: wait this long, then run again
--                                (phase "wait"); head = 1 when this waiter
--                                keeps time for the queue; for blockUs 0,
--                                waitUs is the retry-after
--   {2, 0, nowUs}                this acquisition was settled (aborted,
--                                dropped as dead, or dropped from the queue
--                                by a rate change): start over
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_CORRUPT,
--   REDSEM_RATE <L> <n> <perUs>...      the stored limits differ and were
--                                       not set by rate_set.lua
--   REDSEM_TOOLARGE <i> <units> <n> <perUs>  limit i can never admit this
-- The rate in force is the one stored; the client's creates the gate. Once
-- rate_set.lua has written it (meta "set"), a client with other limits
-- follows the stored ones; before, it gets REDSEM_RATE.

local acq = ARGV[1]
local block = int_arg(ARGV[2], 0, 1e12)
local grace = int_arg(ARGV[3], 0, 1e12)
local tomb = int_arg(ARGV[4], 0, 1e12)
local fresh = ARGV[5] == 'fresh'
local idle = int_arg(ARGV[6], 0, 1e12)
local L = int_arg(ARGV[7], 1, MAX_LIMITS)
local want, w
if L and #ARGV == 7 + 3 * L then want, w = read_limits(L, 8, true) end
if not want or #acq < 16 or string.find(acq, '[|:]') or not block or not grace or not tomb or not idle
  or (ARGV[5] ~= 'fresh' and ARGV[5] ~= 'wait') then
  return redis.error_reply('REDSEM_ARG invalid arguments to rate_take')
end
local err = check_rate_types(meta_key, holders_key, queue_key, waits_key, log1_key, log2_key, log3_key, log4_key, inbox_key)
if err then return redis.error_reply(err) end
local now = now_us()

local st
st, err = rate_state()
if err then return redis.error_reply(err) end
if st and (st.L ~= L or (not st.set and differs(st, want))) then
  return redis.error_reply(rate_err(st))
end
local big = too_large(st or want, w)
if big then return redis.error_reply(too_large_err(st or want, w, big)) end
if not st then
  -- First use, or the data was lost: create the gate.
  st, err = create(want, now, false)
  if err then return redis.error_reply(err) end
end
idle_setting(st, idle)
-- Every reply from here on goes through done: the keys' expiry follows.
local function done(r)
  settle_idle(st, now, want)
  return r
end

sweep(st, now)
expire(st, now)
if redis.call('ZSCORE', waits_key, 'x:' .. acq) then
  redis.call('DEL', inbox_key)
  return done({SETTLED, 0, now})
end
serve(st, now)

if fresh then
  -- Take from the window only when nobody queues: waiters go first.
  if redis.call('LLEN', queue_key) == 0 and fits(st, w) then
    local g = grant(st, acq, w, now)
    return done({GRANTED, g, wait_for(st, w, now), now})
  end
  if block == 0 then return done({WAITING, wait_for(st, w, now), now, 0}) end
  redis.call('RPUSH', queue_key, acq)
  local req = {}
  for i = 1, L do req[i] = fmt_int(w[i]) end
  redis.call('HSET', holders_key, 'r:' .. acq, table.concat(req, ' '))
else
  local r = granted_reply(st, acq, now)
  redis.call('DEL', inbox_key)
  if r then
    redis.call('ZREM', waits_key, 'w:' .. acq)
    forget(st, acq)
    return done(r)
  end
  if not redis.call('ZSCORE', waits_key, 'w:' .. acq) or not redis.call('HGET', holders_key, 'r:' .. acq) then
    -- Dropped from the queue (dead, or unable to fit a lowered rate).
    redis.call('ZREM', waits_key, 'w:' .. acq)
    return done({SETTLED, 0, now})
  end
end

-- Still waiting. The head of the queue keeps time: it wakes when its
-- request fits and takes it itself (see serve). The others sleep in BLPOP
-- until served or rung, waking at least every max(per, 1s) to notice a
-- head that died.
local wait = block
local head = 0
if redis.call('LINDEX', queue_key, 0) == acq then
  head = 1
  redis.call('HSET', meta_key, 'timer', acq)
  wait = math.min(wait, math.max(ready_at(st, w, now) - now, 0))
else
  local longest = 1000000
  for i = 1, st.L do longest = math.max(longest, st.per[i]) end
  wait = math.min(wait, longest)
end
wait = math.max(wait, 1000)
redis.call('ZADD', waits_key, fmt_int(now + wait + grace), 'w:' .. acq)
return done({WAITING, wait, now, head})
