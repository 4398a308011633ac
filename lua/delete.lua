-- delete.lua: remove every key of the semaphore, pending lists included.
-- Holders learn it on their next Refresh or Release (lease lost); the next
-- Acquire creates the semaphore afresh with a new epoch, so no token of the
-- old one is ever accepted again.
-- KEYS: meta, tokens, leases, holders, waits
-- Returns the number of keys removed.

local waits = redis.call('ZRANGE', KEYS[5], 0, -1)
local n = 0
for _, w in ipairs(waits) do
  n = n + redis.call('DEL', base() .. 'pend:' .. string.sub(w, 3))
end
return n + redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
