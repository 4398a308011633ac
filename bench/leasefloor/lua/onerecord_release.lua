-- floor:onerecord (and floor:pipeline), the release: the ZREM of the
-- lease's member is the owner check. Returns 1 if the lease was there (the
-- token went back), else 0.
local tokens, leases = KEYS[1], KEYS[2]
local lease, tok = ARGV[1], ARGV[2]

if redis.call('ZREM', leases, lease) == 0 then return 0 end
redis.call('LPUSH', tokens, tok)
return 1
