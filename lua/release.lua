-- release.lua: give a leased token back, only if this acquisition still owns it.
-- KEYS: meta, tokens, leases, holders
-- ARGV: token, acqID
-- Returns 1 when released, 0 when the lease is no longer recorded (expired and
-- reclaimed, released before, or the semaphore was deleted or lost).
-- The first write is ZREM, which frees memory: release works at OOM.

local tok, acq = ARGV[1], ARGV[2]
-- holders and meta are read, and leases freed, before tokens is written.
local rec = redis.call('HGET', KEYS[4], 't:' .. tok)
if not rec or owner_of(rec) ~= acq then return 0 end
local size, epoch, _, _, err = read_meta()
redis.call('ZREM', KEYS[3], tok)
if not err and epoch and is_valid(tok, epoch, size) then
  local pushed = redis.pcall('LPUSH', KEYS[2], tok)
  if type(pushed) == 'table' and pushed['err'] then
    -- The token list was overwritten with another type. Keep the lease (as
    -- expired, so it is reclaimed once the list is sound again) and fail.
    redis.call('ZADD', KEYS[3], math.floor(now_us() / 1000), tok)
    return redis.error_reply('REDSEM_WRONGTYPE ' .. KEYS[2] .. ' is not a list')
  end
end
redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. acq)
return 1
