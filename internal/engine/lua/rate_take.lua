-- rate_take.lua: RateGate.Wait and Allow on the server. Runs alone (phase
-- "fresh", a call's first script) or right behind the waiter's
--   BLPOP <inbox> <timeout>
-- in the same write (phase "wait"), or after the queue head slept until the
-- earliest token return.
--
-- KEYS: meta, tokens, leases, holders, queue, waits, inbox (see rate_common.lua)
-- ARGV: n, perUs, acqID, blockUs (the longest the client lets one wait last;
--       0: never wait), graceUs, tombUs, phase ("fresh" or "wait")
-- Returns one of
--   {1, token, grantUs, nextUs, nowUs}  granted: a start at Redis time grantUs;
--                                       another may start in nextUs
--   {0, waitUs, nowUs, head}           none free: wait this long, then run
--                                       again (phase "wait"); head = 1 when this
--                                       waiter keeps time for the queue; for
--                                       blockUs 0, waitUs is the retry-after
--   {2, 0, nowUs}                       this acquisition was settled (aborted,
--                                       or dropped as dead): start over
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_RATE <n> <perUs>, REDSEM_CORRUPT.

local n = int_arg(ARGV[1], 1, 100000)
local per = int_arg(ARGV[2], 1, 1e13)
local acq = ARGV[3]
local block = int_arg(ARGV[4], 0, 1e12)
local grace = int_arg(ARGV[5], 0, 1e12)
local tomb = int_arg(ARGV[6], 0, 1e12)
local fresh = ARGV[7] == 'fresh'
if not n or not per or #acq < 16 or string.find(acq, '[|:]') or not block
  or not grace or not tomb or (ARGV[7] ~= 'fresh' and ARGV[7] ~= 'wait') then
  return redis.error_reply('REDSEM_ARG invalid arguments to rate_take')
end
local err = check_rate_types()
if err then return redis.error_reply(err) end
local now = now_us()

local st
st, err = rate_state()
if err then return redis.error_reply(err) end
if st and (st.n ~= n or st.per ~= per) then
  return redis.error_reply('REDSEM_RATE ' .. st.n .. ' ' .. fmt_int(st.per))
end
if not st then
  -- First use, or the data was lost: create the gate with n free tokens.
  if redis.call('EXISTS', KEYS[2]) + redis.call('EXISTS', KEYS[3]) + redis.call('EXISTS', KEYS[4]) > 0 then
    return redis.error_reply('REDSEM_CORRUPT ' .. KEYS[1] .. ' is missing but tokens or leases exist')
  end
  st = {n = n, per = per, epoch = string.sub(acq, 1, 12), fence = now}
  redis.call('HSET', KEYS[1], 'size', n, 'per', fmt_int(per), 'epoch', st.epoch,
    'fence', fmt_int(now), 'rejected', 0, 'created', math.floor(now / 1000))
  local batch = {}
  for i = 1, n do
    batch[#batch + 1] = st.epoch .. ':' .. i
    if #batch == 1000 or i == n then
      redis.call('RPUSH', KEYS[2], unpack(batch))
      batch = {}
    end
  end
end

sweep(now)
return_due(st, now)
if redis.call('ZSCORE', KEYS[6], 'x:' .. acq) then
  redis.call('DEL', KEYS[7])
  return {SETTLED, 0, now}
end
serve(st, now)

if fresh then
  -- Take a free token only when nobody queues: waiters go first.
  if redis.call('LLEN', KEYS[5]) == 0 then
    local tok = pop_token(st)
    if tok then
      local g = grant(st, acq, tok, now)
      return {GRANTED, tok, g, next_in(st, now), now}
    end
  end
  if block == 0 then return {WAITING, next_in(st, now), now, 0} end
  redis.call('RPUSH', KEYS[5], acq)
else
  local r = granted_reply(st, acq, now)
  redis.call('DEL', KEYS[7])
  if r then
    redis.call('ZREM', KEYS[6], 'w:' .. acq)
    return r
  end
  if not redis.call('ZSCORE', KEYS[6], 'w:' .. acq) then
    -- Dropped from the queue as dead (its liveness passed): start over.
    return {SETTLED, 0, now}
  end
end

-- Still waiting. The head of the queue keeps time: it wakes at the earliest
-- token return and takes that token itself (see serve). The others sleep in
-- BLPOP until served or rung, waking at least every max(per, 1s) to notice a
-- head that died.
local wait = block
local head = 0
if redis.call('LINDEX', KEYS[5], 0) == acq then
  head = 1
  redis.call('HSET', KEYS[1], 'timer', acq)
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[2] then wait = math.min(wait, math.max(tonumber(first[2]) - now, 0)) end
else
  wait = math.min(wait, math.max(per, 1000000))
end
wait = math.max(wait, 1000)
redis.call('ZADD', KEYS[6], fmt_int(now + wait + grace), 'w:' .. acq)
return {WAITING, wait, now, head}
