-- rw_acquire.lua: RWMutex.RLock, TryRLock, Lock and TryLock on the server.
-- Runs alone (phase "fresh", an acquisition's first script) or right behind
-- the waiter's
--   BLPOP <bell> <timeout>
-- in the same write (phase "wait").
--
-- KEYS: meta, leases, holders, queue, waits, bell (see rw_common.lua)
-- ARGV: acqID, mode ("r" or "w"), ttlMs, label, blockMs (the longest the
--       client lets one wait last; 0: never wait), graceMs, phase ("fresh"
--       or "wait")
-- Returns one of
--   {1, "<epoch>:<mode>", fence, deadlineMs, nowUs}  granted
--   {0, blockMs, nowUs}   not granted: queued, wait at most blockMs, then run
--                         again (phase "wait"); for blockMs 0, refused
--   {2, 0, nowUs}         this acquisition was settled (aborted, or dropped
--                         as dead, or its grant expired unconfirmed): start over
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_CORRUPT.

local acq, mode = ARGV[1], ARGV[2]
local ttl = int_arg(ARGV[3], 1, 1e12)
local label = ARGV[4]
local block = int_arg(ARGV[5], 0, 1e9)
local grace = int_arg(ARGV[6], 0, 1e9)
local phase = ARGV[7]
if #acq < 16 or string.find(acq, '[|:]') or (mode ~= 'r' and mode ~= 'w') or not ttl
  or not block or not grace or (phase ~= 'fresh' and phase ~= 'wait') then
  return redis.error_reply('REDSEM_ARG invalid arguments to rw_acquire')
end
local st, err = rw_open(meta_key, leases_key, holders_key, queue_key, waits_key, bell_key)
if err then return redis.error_reply(err) end
local now = now_us()
local now_ms = math.floor(now / 1000)
if not st then
  -- First use, or the data was lost: create the lock, free.
  if redis.call('EXISTS', leases_key) + redis.call('EXISTS', holders_key) + redis.call('EXISTS', queue_key) > 0 then
    return redis.error_reply('REDSEM_CORRUPT ' .. meta_key .. ' is missing but leases or waiters exist')
  end
  st = {epoch = string.sub(acq, 1, 12), fence = now}
  redis.call('HSET', meta_key, 'epoch', st.epoch, 'fence', fmt_int(now), 'created', now_ms)
end

rw_reclaim(st, now_ms)
if redis.call('ZSCORE', waits_key, 'x:' .. acq) then
  redis.call('DEL', bell_key)
  return {SETTLED, 0, now}
end
serve(st, now)

if phase == 'fresh' then
  -- Granted at once only when nobody queues: waiters go first.
  if redis.call('LLEN', queue_key) == 0 and not st.writer and (mode == 'r' or not any_lease()) then
    local fence = grant(st, acq, mode, now, ttl, 'c', label)
    return {GRANTED, st.epoch .. ':' .. mode, fence, now_ms + ttl, now}
  end
  if block == 0 then return {WAITING, 0, now} end
  redis.call('RPUSH', queue_key, acq)
  redis.call('HSET', holders_key, 'q:' .. acq, mode .. '|' .. fmt_int(ttl) .. '|' .. fmt_int(grace) .. '|' .. label)
  if redis.call('LINDEX', queue_key, 0) == acq then redis.call('HSET', meta_key, 'timer', acq) end
else
  redis.call('DEL', bell_key)
  local l, deadline = lease_of(acq)
  if l then return confirm(st, acq, l, deadline, now, ttl) end
  if not redis.call('ZSCORE', waits_key, 'w:' .. acq) then
    -- Dropped from the queue as dead, or granted and expired before this
    -- script confirmed it: start over.
    return {SETTLED, 0, now}
  end
end

-- Still waiting. Every waiter wakes by the earliest lease deadline, to
-- reclaim it if its holder died; one behind the head also by the head's
-- liveness deadline, to drop the head if it died. Only a release, an abort
-- or a reclaim lets a waiter in, and those ring its doorbell.
local wait = block
local first = redis.call('ZRANGE', leases_key, 0, 0, 'WITHSCORES')
if first[2] then wait = math.min(wait, tonumber(first[2]) - now_ms) end
local head = redis.call('LINDEX', queue_key, 0)
if head ~= acq then
  local live = redis.call('ZSCORE', waits_key, 'w:' .. tostring(head))
  if live then wait = math.min(wait, tonumber(live) - now_ms) end
end
wait = math.max(wait, 1)
redis.call('ZADD', waits_key, fmt_int(now_ms + wait + grace), 'w:' .. acq)
return {WAITING, wait, now}
