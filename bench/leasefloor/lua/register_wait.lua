-- floor:register and floor:queued, the wait's script (behind BLMOVE tokens
-- pend:<acq>): floor:lease's, which also takes the registration out.
-- Returns {token, fence}.
local pend, leases, holders, waits = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local acq, ttl = ARGV[1], ARGV[2]

local tok = redis.call('LPOP', pend)
local t = redis.call('TIME')
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, tok)
redis.call('HSET', holders, tok, acq .. '|' .. fence)
redis.call('ZREM', waits, 'w:' .. acq)
return {tok, fence}
