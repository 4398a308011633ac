-- delete.lua: remove every key of the semaphore, pending lists, the weighted
-- queue, its doorbells and part lists included.
-- Holders learn it on their next Refresh or Release (lease lost); the next
-- Acquire creates the semaphore afresh with a new epoch, so no token of the
-- old one is ever accepted again.
-- KEYS: meta, tokens, leases, holders, waits
-- ARGV: none
-- Returns the number of keys removed.

-- The keys of acquisitions in flight (pending lists, weighted doorbells and
-- part lists) are named after them in waits and in the weighted queue; all
-- share the tag.
local n = 0
for _, w in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
  local id = string.sub(w, 3)
  n = n + redis.call('DEL', base() .. 'pend:' .. id, base() .. 'bell:' .. id, part_of(id))
end
if not type_err(base() .. 'wqueue', 'list') then
  for _, e in ipairs(redis.call('LRANGE', base() .. 'wqueue', 0, -1)) do
    n = n + redis.call('DEL', base() .. 'bell:' .. (string.match(e, '^([^|]+)') or e))
  end
end
return n + redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], base() .. 'wqueue')
