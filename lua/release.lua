-- release.lua: give a leased token back, only if this acquisition still owns it.
-- KEYS: meta, tokens, leases, holders
-- ARGV: token, acqID
-- Returns 1 when released, 0 when the lease is no longer recorded (expired and
-- reclaimed, released before, or the semaphore was deleted or lost).
-- The first write is ZREM, which frees memory: release works at OOM.

local tok, acq = ARGV[1], ARGV[2]
-- holders, meta and leases are read (or freed) before tokens is written.
local err = type_err(KEYS[2], 'list')
if err then return redis.error_reply(err) end
local rec = redis.call('HGET', KEYS[4], 't:' .. tok)
if not rec or owner_of(rec) ~= acq then return 0 end
local size, epoch, _
size, epoch, _, _, err = read_meta()
redis.call('ZREM', KEYS[3], tok)
redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. acq)
if not err and epoch and is_valid(tok, epoch, size) then
  redis.call('LPUSH', KEYS[2], tok)
end
return 1
