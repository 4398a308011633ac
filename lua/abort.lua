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
local err = check_types(5)
if err then return redis.error_reply(err) end
err = type_err(KEYS[6], 'list')
if err then return redis.error_reply(err) end
local now = now_us()
local now_ms = math.floor(now / 1000)
local size, epoch, _
size, epoch, _, _, err = read_meta()
if err then return redis.error_reply(err) end

local tok = redis.call('HGET', KEYS[4], 'a:' .. acq)
if tok then
  local rec = redis.call('HGET', KEYS[4], 't:' .. tok)
  local score = redis.call('ZSCORE', KEYS[3], tok)
  if mode == 'resolve' and rec and score then
    local fence = string.match(rec, '^[^|]*|([^|]*)|')
    return {1, tok, tonumber(fence), tonumber(score), now}
  end
  redis.call('ZREM', KEYS[3], tok)
  redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. acq)
  if rec and owner_of(rec) == acq then give_back(tok, epoch, size, true) end
  return {3, 0, now}
end
local toks = redis.call('LRANGE', KEYS[6], 0, 9)
redis.call('DEL', KEYS[6])
redis.call('ZREM', KEYS[5], 'w:' .. acq)
redis.call('ZADD', KEYS[5], now_ms + tomb, 'x:' .. acq)
redis.call('HSET', KEYS[4], 'x:' .. acq, now_ms + tomb)
for _, t in ipairs(toks) do give_back(t, epoch, size) end
return {0, 0, now}
