-- floor:kept, the acquire (KEYS: tokens, leases; ARGV: acq, ttlMs): the
-- move of a free token onto the holder's list is the script's first write
-- (LMOVE may grow memory: at maxmemory Redis refuses it, before any
-- change), then the grant, and the next token if that one was dropped.
-- With none free it sweeps and registers the acquisition, and answers 0:
-- the client writes BLMOVE and kept_record.
local tok = redis.call('LMOVE', base, held, 'LEFT', 'RIGHT')
while tok do
  local g = grant(tok)
  if g then return g end
  tok = redis.call('LMOVE', base, held, 'LEFT', 'RIGHT')
end
local ms = now()
sweep(ms)
redis.call('ZADD', leases, ms + ttl + grace, acq)
return 0
