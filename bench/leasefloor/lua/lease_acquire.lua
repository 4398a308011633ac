-- floor:lease, the wait's script (behind BLMOVE tokens pend:<acq>): pops
-- the token the BLMOVE moved and records its lease the way redsem does, a
-- leases member scored by its deadline and a holder record owner|fence.
-- Returns {token, fence}.
local pend, leases, holders = KEYS[1], KEYS[2], KEYS[3]
local acq, ttl = ARGV[1], ARGV[2]

local tok = redis.call('LPOP', pend)
local t = redis.call('TIME')
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, tok)
redis.call('HSET', holders, tok, acq .. '|' .. fence)
return {tok, fence}
