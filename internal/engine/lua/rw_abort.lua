-- rw_abort.lua: settle an RWMutex acquisition whose reply the client could
-- not read (cancelled context, dropped connection, read timeout).
-- KEYS: meta, leases, holders, queue, waits, bell (see rw_common.lua)
-- ARGV: acqID, mode ("release" or "resolve"), tombMs, ttlMs
-- If the acquisition holds a lease: mode "resolve" keeps it (confirming a
-- provisional grant with ttlMs) and returns {1, "<epoch>:<mode>", fence,
-- deadlineMs, nowUs} as rw_acquire.lua does; mode "release" gives it back
-- and returns {3, 0, nowUs}. Otherwise the waiter leaves the queue, a
-- tombstone stops a late rw_acquire.lua of it from waiting or taking
-- anything, and it returns {0, 0, nowUs}. Either way the waiters it held
-- up are served.

local acq, mode = ARGV[1], ARGV[2]
local tomb, ttl = int_arg(ARGV[3], 0, 1e9), int_arg(ARGV[4], 1, 1e12)
if not tomb or not ttl or (mode ~= 'release' and mode ~= 'resolve') then
  return redis.error_reply('REDSEM_ARG invalid arguments to rw_abort')
end
local st, err = rw_open(meta_key, leases_key, holders_key, queue_key, waits_key, bell_key)
if err then return redis.error_reply(err) end
local now = now_us()
local now_ms = math.floor(now / 1000)

local released = false
if st then
  local l, deadline = lease_of(acq)
  if l and mode == 'resolve' and deadline > now_ms then
    redis.call('DEL', bell_key)
    return confirm(st, acq, l, deadline, now, ttl)
  end
  if l then
    unlease(st, acq)
    released = true
  end
end
forget_waiter(acq)
redis.call('ZADD', waits_key, fmt_int(now_ms + tomb), 'x:' .. acq)
if st then
  rw_reclaim(st, now_ms)
  serve(st, now)
end
if released then return {RELEASED, 0, now} end
return {WAITING, 0, now}
