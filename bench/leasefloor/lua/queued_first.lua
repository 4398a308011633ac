-- floor:queued, the first script, written in one write with the wait: it
-- only registers the acquisition in waits and never grants. Returns 0.
local waits = KEYS[4]
local acq = ARGV[1]

local t = redis.call('TIME')
redis.call('ZADD', waits, t[1] * 1000 + 35000, 'w:' .. acq)
return 0
