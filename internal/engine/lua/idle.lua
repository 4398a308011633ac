-- idle.lua: idle expiry (WithIdleExpiry), after meta.lua.
--
-- Meta "idle" is the idle time in ms the acquisitions ask for (absent:
-- off); meta "exp", a time in ms of Redis TIME, is set while every key of
-- the semaphore expires then (PEXPIREAT, one time for all). Only an idle
-- semaphore carries it: every token on the list, no lease, no waiter in
-- waits (tombstones only), no weighted queue or collector, no shrink
-- draining. Every script that takes a token, records a lease, registers a
-- waiter or starts a collection calls wake first. The expiry is never
-- before the last tombstone's, so a late BLMOVE finds the tombstone or no
-- semaphore at all.

-- idle_setting stores the idle time an acquisition asks for (0: off) when
-- it differs, with holders' "idle" flag in step (release_fast.lua reads
-- meta only when holders has it). A holders key of the wrong type is left
-- alone here: the script fails on it later, with its undo.
local function idle_setting(idle)
  local cur = tonumber(redis.call('HGET', meta_key, 'idle')) or 0
  local flag = redis.pcall('HGET', holders_key, 'idle')
  if type(flag) == 'table' then flag = idle > 0 end
  if cur == idle and (idle > 0) == (flag and true or false) then return end
  if idle > 0 then
    redis.call('HSET', meta_key, 'idle', fmt_int(idle))
    redis.pcall('HSET', holders_key, 'idle', 1)
  else
    redis.call('HDEL', meta_key, 'idle')
    redis.pcall('HDEL', holders_key, 'idle')
  end
end

-- idle_keys are the keys that may exist while the semaphore is idle.
local function idle_keys()
  return {meta_key, tokens_key, holders_key, base() .. 'waits'}
end

-- wake removes the idle expiry, if set.
local function wake()
  if not redis.call('HGET', meta_key, 'exp') then return end
  for _, key in ipairs(idle_keys()) do redis.call('PERSIST', key) end
  redis.call('HDEL', meta_key, 'exp')
end

-- settle_idle sets the idle expiry if the semaphore is idle and meta asks
-- for one: at now_ms plus the idle time, or the last tombstone's expiry if
-- later. Otherwise it removes it (wake).
local function settle_idle(now_ms)
  local m = redis.call('HMGET', meta_key, 'size', 'idle', 'coll', 'over', 'held')
  local size, idle, coll, over, held = tonumber(m[1]), tonumber(m[2]), m[3], m[4], m[5]
  if not size or not idle or idle <= 0 or coll or over or held then return wake() end
  local n = redis.pcall('LLEN', tokens_key)
  if n ~= size or redis.call('EXISTS', leases_key, base() .. 'wqueue') > 0 then return wake() end
  local at = now_ms + idle
  local waits = base() .. 'waits'
  if type_err(waits, 'zset') then return wake() end
  local w = redis.call('ZRANGE', waits, 0, -1, 'WITHSCORES')
  for i = 1, #w, 2 do
    if string.sub(w[i], 1, 2) ~= 'x:' then return wake() end
    at = math.max(at, tonumber(w[i + 1]))
  end
  for _, key in ipairs(idle_keys()) do redis.call('PEXPIREAT', key, fmt_int(at)) end
  redis.call('HSET', meta_key, 'exp', fmt_int(at))
end
