-- reclaim.lua: return the tokens of expired leases and of pending lists whose
-- waiter never confirmed. Acquire does the same on every call; this script
-- lets an operator or a ticker do it without acquiring.
-- KEYS: meta, tokens, leases, holders, waits
-- ARGV: limit
-- Returns the number of tokens put back.

local limit = int_arg(ARGV[1], 1, 100000)
if not limit then return redis.error_reply('REDSEM_ARG invalid limit') end
local err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key)
if err then return redis.error_reply(err) end
local size, epoch, _
size, epoch, _, _, err = read_meta()
if err then return redis.error_reply(err) end
local now_ms = math.floor(now_us() / 1000)
local due_now
due_now, err = overdue(now_ms, limit)
if err then return redis.error_reply(err) end
local n = reclaim(due_now, epoch, size)
if epoch then
  redis.call('HSET', meta_key, 'due', fmt_int(next_due()))
  settle_idle(now_ms)
end
return n
