-- rate_idle.lua: a gate's idle expiry (rate.WithIdleExpiry), after
-- rate_window.lua.
--
-- Meta "idle" is the idle time in ms the starts ask for (absent: off; each
-- start writes its own when it differs, so the last one's applies); meta
-- "exp", a time in ms of Redis TIME, is set while every key of the gate
-- expires then (PEXPIREAT, one time for all). A gate is idle once the
-- window of its last grant (or rate change) has passed and no waiter's
-- liveness deadline or tombstone is still ahead: exp is the latest of
--   fence + the longest per (stored, or the start's own: the rate a gate
--   created afresh gets), and the highest score in waits,
-- plus the idle time; a script that is no start (rate_set.lua,
-- rate_abort.lua) knows no client's own per, and moves exp on by as much
-- as it moved the fence (a rate change, the starts it grants to waiters;
-- up to 1ms more, rounded up), if that is later: exp stays at least as far
-- past the fence as the last start put it. Every script that writes calls
-- settle_idle last, so a key it creates gets the others' expiry, and a
-- later use moves it on. Nothing in a window is ever lost while the
-- clients of a gate share their limits: the expiry is past every grant's
-- window, also under the own rate of the start that creates the gate
-- again (after a rate set at run time, with a shorter per). Clients with
-- other limits (followers of a rate set) are not covered: the last start's
-- own per decides. A live waiter
-- runs its script before its deadline and so moves exp on; one that does
-- not is dead by the gate's own rule (sweep).

-- idle_setting stores the idle time (ms, 0: off) a start asks for when
-- it differs from st.idle.
local function idle_setting(st, idle)
  if st.idle == idle then return end
  if idle > 0 then
    redis.call('HSET', meta_key, 'idle', fmt_int(idle))
  else
    redis.call('HDEL', meta_key, 'idle')
  end
  st.idle = idle
end

-- settle_idle sets (or, with the expiry off, removes) the expiry of every
-- key of gate st and of the doorbells this script rang, at Redis time now
-- (µs); own is the rate of the start that runs it, or nil.
local function settle_idle(st, now, own)
  local keys = {meta_key, holders_key, queue_key, waits_key}
  for i = 1, st.L do keys[#keys + 1] = log_key(i) end
  if st.idle <= 0 then
    if not st.exp then return end
    for _, key in ipairs(keys) do redis.call('PERSIST', key) end
    redis.call('HDEL', meta_key, 'exp')
    return
  end
  local at = st.fence
  for i = 1, st.L do
    at = math.max(at, st.fence + st.per[i])
    if own then at = math.max(at, st.fence + own.per[i]) end
  end
  local last = redis.call('ZRANGE', waits_key, -1, -1, 'WITHSCORES')
  if last[2] then at = math.max(at, tonumber(last[2])) end
  at = math.ceil(at / 1000) + st.idle
  local exp = tonumber(st.exp)
  if not own and exp then
    at = math.max(at, exp + math.ceil((st.fence - (st.fence_read or st.fence)) / 1000))
  end
  -- Idle for long enough already (a waiter dropped as dead): expire, all
  -- at once, rather than delete meta with a PEXPIREAT in the past.
  at = math.max(at, math.floor(now / 1000) + 1)
  for _, acq in ipairs(rung) do keys[#keys + 1] = inbox_of(acq) end
  for _, key in ipairs(keys) do redis.call('PEXPIREAT', key, fmt_int(at)) end
  redis.call('HSET', meta_key, 'exp', fmt_int(at))
end
