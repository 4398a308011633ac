-- abort.lua: settle an acquisition whose reply the client could not read
-- (cancelled context, dropped connection, read timeout).
-- KEYS: meta, tokens, leases, holders, waits, pend
-- ARGV: acqID, mode ("release" or "resolve"), tombMs
-- If the acquisition holds a lease: mode "release" gives the token back and
-- returns {3, 0, nowUs}; mode "resolve" keeps it and returns
-- {1, token, fence, deadlineMs, nowUs} as acquire.lua does.
-- Otherwise the pending list goes back to the tokens, a tombstone stops a
-- BLMOVE of this acquisition that is still registered from ever leasing, and
-- it returns {0, 0, nowUs}.

local acq, mode, tomb = ARGV[1], ARGV[2], int_arg(ARGV[3], 0, 1e9)
if not tomb or (mode ~= 'release' and mode ~= 'resolve') then
  return redis.error_reply('REDSEM_ARG invalid arguments to abort')
end
local err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key)
if err then return redis.error_reply(err) end
err = type_err(pend_key, 'list')
if err then return redis.error_reply(err) end
local now = now_us()
local now_ms = math.floor(now / 1000)
local size, epoch, _, due
size, epoch, _, due, err = read_meta()
if err then return redis.error_reply(err) end

-- The lease is this acquisition's only if its record says so: an "a:" entry
-- that points at a token another acquisition holds (stale or forged) is
-- dropped, and that holder's lease is left alone.
local tok = redis.call('HGET', holders_key, 'a:' .. acq)
local rec = tok and redis.call('HGET', holders_key, 't:' .. tok)
if tok and not (rec and owner_of(rec) == acq) then
  redis.call('HDEL', holders_key, 'a:' .. acq)
  tok = nil
end
if tok then
  local score = redis.call('ZSCORE', leases_key, tok)
  if mode == 'resolve' and score then
    local fence = string.match(rec, '^[^|]*|([^|]*)|')
    return {GRANTED, tok, tonumber(fence), tonumber(score), now}
  end
  redis.call('ZREM', leases_key, tok)
  redis.call('HDEL', holders_key, 't:' .. tok, 'a:' .. acq)
  give_back(tok, epoch, size, true)
  settle_idle(now_ms)
  return {RELEASED, 0, now}
end
local toks = redis.call('LRANGE', pend_key, 0, 9)
redis.call('DEL', pend_key)
redis.call('ZREM', waits_key, 'w:' .. acq)
redis.call('ZADD', waits_key, now_ms + tomb, 'x:' .. acq)
-- due may not fall after the tombstone: a token a late BLMOVE moves into the
-- pending list is swept with it.
if due and now_ms + tomb < due then redis.call('HSET', meta_key, 'due', now_ms + tomb) end
-- The tombstone lives in meta (where the acquire script reads it with the
-- rest of meta), or in holders while the semaphore does not exist (create
-- moves it to meta).
redis.call('HSET', size and meta_key or holders_key, 'x:' .. acq, now_ms + tomb)
for _, t in ipairs(toks) do give_back(t, epoch, size) end
settle_idle(now_ms)
return {WAITING, 0, now}
