-- floor:held, the wait's script (behind BLMOVE tokens held:<acq>): the
-- token stays on the holder's own list, which is the owner check of a
-- release of commands alone (floor:noscript's); the script records the
-- lease as one leases member, the acquisition, scored by its deadline.
-- Returns {token, fence}.
local held, leases = KEYS[1], KEYS[2]
local acq, ttl = ARGV[1], ARGV[2]

local tok = redis.call('LINDEX', held, 0)
local t = redis.call('TIME')
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, acq)
return {tok, t[1] .. string.rep('0', 6 - #t[2]) .. t[2]}
