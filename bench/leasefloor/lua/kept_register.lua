-- floor:kept, first of the waiting write (KEYS: tokens, leases; ARGV: acq,
-- ttlMs): sweeps and registers the acquisition, so that a token the BLMOVE
-- behind it moves onto the holder's list is swept back if kept_record
-- never runs. Returns TIME in µs (the client tells from it whether the
-- BLMOVE blocked).
local ms, us = now()
sweep(ms)
redis.call('ZADD', leases, ms + ttl + grace, acq)
return us
