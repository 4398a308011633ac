-- rate_set.lua: SetRate and SetLimits: change the limits of a gate for
-- every client at once. The new rate is in force from this script's Redis
-- time on (changedUs, just after the last grant); from then on every client
-- follows the stored rate (meta "set"), whatever its own. A gate that does
-- not exist is created with it.
-- KEYS: meta, holders, queue, waits, log1, log2, log3, log4 (see rate_common.lua)
-- ARGV: limits (L, as many as the gate has), then for each limit: n, perUs
-- Returns {changedUs}.
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_CORRUPT,
--   REDSEM_RATE <L> <n> <perUs>...  the gate has another number of limits
--
-- The grants a shorter per no longer covers leave the window at once. A
-- longer per cannot recall the grants that left the old, shorter window
-- before the change: they are gone (see docs/rate-gate.md, "Changing the
-- rate"). Waiters are served under the new rate at once, the head is rung
-- to re-time its wake-up, and waiters asking for more than a lowered n
-- leave the queue and are rung (they fail with REDSEM_TOOLARGE).

local L = int_arg(ARGV[1], 1, MAX_LIMITS)
local want
if L and #ARGV == 1 + 2 * L then want = read_limits(L, 2, false) end
if not want then
  return redis.error_reply('REDSEM_ARG invalid arguments to rate_set')
end
local err = check_rate_types(8)
if err then return redis.error_reply(err) end
local now = now_us()

local st
st, err = rate_state()
if err then return redis.error_reply(err) end
if st and st.L ~= L then return redis.error_reply(rate_err(st)) end
if not st then
  st, err = create(want, now, true)
  if err then return redis.error_reply(err) end
  return {st.fence}
end

expire(st, now) -- under the old rate: what it has let go stays gone
local at = math.max(st.fence + 1, now)
st.fence = at
local f = {'fence', fmt_int(at), 'set', 1, 'changed', fmt_int(at)}
for i = 1, L do
  st.n[i], st.per[i] = want.n[i], want.per[i]
  f[#f + 1] = 'size' .. sfx(i)
  f[#f + 1] = fmt_int(want.n[i])
  f[#f + 1] = 'per' .. sfx(i)
  f[#f + 1] = fmt_int(want.per[i])
end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('HDEL', KEYS[1], 'timer') -- serve rings the head: its wake-up moved
expire(st, now)

for _, acq in ipairs(redis.call('LRANGE', KEYS[3], 0, 999)) do
  local w = request_of(acq, L)
  if w and too_large(st, w) then
    redis.call('LREM', KEYS[3], 0, acq)
    redis.call('HDEL', KEYS[2], 'r:' .. acq)
    ring(acq)
  end
end
serve(st, now)
return {at}
