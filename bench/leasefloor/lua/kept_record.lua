-- floor:kept, last of the waiting write, behind BLMOVE tokens
-- <tokens>:held:<acq> (KEYS: the holder's list, leases; ARGV: acq, ttlMs):
-- the token stays where the BLMOVE put it, and the grant moves the
-- registration's score to the deadline. Returns {token, fence}, or 0 if
-- the BLMOVE timed out or moved a token that was dropped (the client
-- registers and waits again).
local tok = redis.call('LINDEX', held, 0)
local g = tok and grant(tok)
if g then return g end
redis.call('ZREM', leases, acq)
return 0
