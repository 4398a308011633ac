-- rw_release.lua: give back an RWMutex lease, only while this acquisition
-- still owns it, and let in the waiters it held up.
-- KEYS: meta, leases, holders, queue, waits (see rw_common.lua)
-- ARGV: token ("<epoch>:<mode>", unused), acqID, then other tokens (never any)
-- Returns 1 when released, 0 when the lease is no longer recorded (expired
-- and reclaimed, released before, or the lock was lost). A lease that
-- expired but was not reclaimed yet is released normally.

local acq = ARGV[2]
local st, err = rw_open(meta_key, leases_key, holders_key, queue_key, waits_key)
if err then return redis.error_reply(err) end
if not st then return not_here(leases_key) or 0 end
local l = lease_of(acq)
if not l then return not_here(leases_key) or 0 end
local now = now_us()
unlease(st, acq)
rw_reclaim(st, math.floor(now / 1000))
serve(st, now)
return 1
