-- rw_refresh.lua: extend an RWMutex lease that this acquisition still owns
-- and that has not yet expired. An expired lease is never resurrected (FM-09).
-- KEYS: meta, leases, holders, queue, waits (see rw_common.lua)
-- ARGV: token ("<epoch>:<mode>", unused), acqID, ttlMs, then other tokens (never any)
-- Returns {1, deadlineMs, nowUs} when extended, {0, 0, nowUs} when lost.
-- A deadline moved earlier rings the head of the queue, which wakes by the
-- earliest lease deadline: so a holder that shortens its lease and dies is
-- reclaimed by the new deadline, not the old one.

local acq, ttl = ARGV[2], int_arg(ARGV[3], 1, 1e12)
if not ttl then return redis.error_reply('REDSEM_ARG invalid ttl') end
local err = check_rw_types(meta_key, leases_key, holders_key, queue_key, waits_key)
if err then return redis.error_reply(err) end
local now = now_us()
local now_ms = math.floor(now / 1000)
local l, deadline = lease_of(acq)
if not l or deadline <= now_ms then return not_here(leases_key) or {0, 0, now} end
redis.call('ZREM', leases_key, acq)
redis.call('ZADD', leases_key, fmt_int(now_ms + ttl), acq)
if now_ms + ttl < deadline then
  -- Every waiter wakes by the earliest deadline; the head is enough to
  -- reclaim it, and it tells the others.
  local head = redis.call('LINDEX', queue_key, 0)
  if head then rw_ring(head) end
end
return {1, now_ms + ttl, now}
