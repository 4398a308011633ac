-- rate_set.lua: SetRate and SetLimits: change the limits of a gate for
-- every client at once. The new rate is in force from this script's Redis
-- time on (changedUs, just after the last grant); from then on every client
-- follows the stored rate (meta "set"), whatever its own. A gate that does
-- not exist is created with it.
-- KEYS: meta, holders, queue, waits, log1, log2, log3, log4 (see rate_common.lua)
-- ARGV: idleMs (the idle expiry of a gate it creates, 0: none; a gate's
--       own stays, rate_idle.lua), limits (L, as many as the gate has),
--       then for each limit: n, perUs
-- Returns {changedUs}.
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_CORRUPT,
--   REDSEM_RATE <L> <n> <perUs>...  the gate has another number of limits
--
-- The grants a shorter per no longer covers leave the window at once. A
-- longer per would reach grants that left the old, shorter window before
-- the change and are gone: a made-up grant stands for them (count_forgotten),
-- so no window holds more than the new rate (see docs/rate-gate.md,
-- "Changing the rate"). Waiters are served under the new rate at once, the
-- head is rung to re-time its wake-up, and waiters asking for more than a
-- lowered n leave the queue and are rung (they fail with REDSEM_TOOLARGE).

local idle = int_arg(ARGV[1], 0, 1e12)
local L = int_arg(ARGV[2], 1, MAX_LIMITS)
local want
if L and #ARGV == 2 + 2 * L then want = read_limits(L, 3, false) end
if not want or not idle then
  return redis.error_reply('REDSEM_ARG invalid arguments to rate_set')
end
-- count_forgotten keeps limit i's log counting, for every window of the new
-- per, at least what the grants in it took, as far as the new n goes.
-- The log holds every grant after a horizon h and none before: h is the
-- time of the made-up grant FORGOTTEN..i at the front of the log, which a
-- change before this one put there, or else now - was (was the old per:
-- expire let the grants at or before it go), which only a longer per
-- reaches, and only on a gate created (meta "created", ms) by then; with
-- idle expiry a gate created later may have had a predecessor whose keys
-- expired, its grants at least the idle time before creation, and h is
-- then that time (a gate this script creates: now - idle). The
-- made-up grant, dated h, takes max(0, n - used) more units,
-- so that every window reaching back to h holds at least n units: nothing
-- more is admitted until h + per, and from then on the log holds every
-- grant of the window again. It is put before the log's first entry (its
-- running sum is back, and back goes down by its units) and leaves the
-- window as a grant does.
local function count_forgotten(st, i, was, now, idle_us)
  local id = FORGOTTEN .. i
  local front = redis.call('ZRANGE', log_key(i), 0, 0)[1]
  local h, w
  if front == id then h, w = grant_of(id, st.L) end
  if not h then
    if st.per[i] <= was then return end
    h = now - was
    local born = tonumber(redis.call('HGET', meta_key, 'created'))
    if born and born * 1000 > h then
      -- The log holds every grant since born. Before it, only a gate of
      -- the name whose keys expired, at least the idle time before.
      if idle_us <= 0 then return end
      h = born * 1000 - idle_us
    end
    front, w = nil, {}
    for j = 1, st.L do w[j] = 0 end
  end
  local add = math.max(0, st.n[i] - used(st, i))
  if front and add == 0 then return end
  if not front then redis.call('ZADD', log_key(i), fmt_int(st.back[i]), id) end
  st.back[i] = st.back[i] - add
  save_limit(st, i)
  w[i] = w[i] + add
  local rec = {fmt_int(h)}
  for j = 1, st.L do rec[j + 1] = fmt_int(w[j]) end
  redis.call('HSET', holders_key, 'g:' .. id, table.concat(rec, ' '))
end

local err = check_rate_types(meta_key, holders_key, queue_key, waits_key, log1_key, log2_key, log3_key, log4_key)
if err then return redis.error_reply(err) end
local now = now_us()

local st
st, err = rate_state()
if err then return redis.error_reply(err) end
if st and st.L ~= L then return redis.error_reply(rate_err(st)) end
if not st then
  st, err = create(want, now, true)
  if err then return redis.error_reply(err) end
  if idle > 0 then
    -- A gate of the name may have expired a moment ago (rate_idle.lua):
    -- its grants were at least idle before now, which a longer per
    -- reaches. They count as forgotten grants, as for a longer per.
    for i = 1, L do count_forgotten(st, i, idle * 1000, now, idle * 1000) end
    idle_setting(st, idle)
    settle_idle(st, now)
  end
  return {st.fence}
end

expire(st, now) -- under the old rate: what it has let go stays gone
local at = math.max(st.fence + 1, now)
st.fence = at
local f = {'fence', fmt_int(at), 'set', 1, 'changed', fmt_int(at)}
local was = {}
for i = 1, L do
  was[i] = st.per[i]
  st.n[i], st.per[i] = want.n[i], want.per[i]
  f[#f + 1] = 'size' .. sfx(i)
  f[#f + 1] = fmt_int(want.n[i])
  f[#f + 1] = 'per' .. sfx(i)
  f[#f + 1] = fmt_int(want.per[i])
end
redis.call('HSET', meta_key, unpack(f))
redis.call('HDEL', meta_key, 'timer') -- serve rings the head: its wake-up moved
expire(st, now)
for i = 1, L do count_forgotten(st, i, was[i], now, math.max(st.idle, idle) * 1000) end

for _, acq in ipairs(redis.call('LRANGE', queue_key, 0, 999)) do
  local w = request_of(acq, L)
  if w and too_large(st, w) then
    redis.call('LREM', queue_key, 0, acq)
    redis.call('HDEL', holders_key, 'r:' .. acq)
    ring(acq)
  end
end
serve(st, now)
settle_idle(st, now) -- the meta's idle time stays; the expiry follows the new rate
return {at}
