-- floor:lease (and register, queued), the release: gives the token back
-- only if the holder record is the releaser's. Returns 1 if acq held the
-- token (it went back), else 0.
local tokens, leases, holders = KEYS[1], KEYS[2], KEYS[3]
local tok, acq = ARGV[1], ARGV[2]

local rec = redis.call('HGET', holders, tok)
if not rec or string.sub(rec, 1, #acq + 1) ~= acq .. '|' then return 0 end
redis.call('HDEL', holders, tok)
redis.call('LPUSH', tokens, tok)
redis.call('ZREM', leases, tok)
return 1
