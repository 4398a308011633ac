-- floor:onerecord, the wait's script (behind BLMOVE tokens pend:<acq>):
-- pops the token and records the lease as one leases member,
-- token|owner|fence, scored by its deadline. Returns {token, fence}.
local pend, leases = KEYS[1], KEYS[2]
local acq, ttl = ARGV[1], ARGV[2]

local tok = redis.call('LPOP', pend)
local t = redis.call('TIME')
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, tok .. '|' .. acq .. '|' .. fence)
return {tok, fence}
