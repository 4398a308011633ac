-- check.lua: the token inventory, read in one script (Semaphore.Check). It
-- writes nothing.
-- KEYS: meta, tokens, leases, holders, waits
-- ARGV: none
-- Returns {exists, size, epoch, nowUs, leased, pending, free, retired, dups,
-- strangers, missing, held}; see inventory.lua for what each list holds.

local err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key)
if err then return redis.error_reply(err) end
local size, epoch, _
size, epoch, _, _, err = read_meta('read')
if err then return redis.error_reply(err) end
local exists = 1
if not size then exists, size, epoch = 0, 0, '' end
local inv = inventory(epoch, size)
return {exists, size, epoch, now_us(), inv.leased, inv.pending, inv.free,
  inv.retired, inv.dups, inv.strangers, inv.missing, inv.held}
