-- floor:register, the first round trip: takes a free token and records its
-- lease, or, with none free, registers the acquisition in waits (scored by
-- when it may be swept) and answers "wait". Returns {token, fence}, or 0
-- (registered: wait).
local tokens, leases, holders, waits = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local acq, ttl = ARGV[1], ARGV[2]

local t = redis.call('TIME')
local tok = redis.call('LPOP', tokens)
if not tok then
  redis.call('ZADD', waits, t[1] * 1000 + 35000, 'w:' .. acq)
  return 0
end
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, tok)
redis.call('HSET', holders, tok, acq .. '|' .. fence)
return {tok, fence}
