-- refresh.lua: extend a lease that this acquisition still owns and that has
-- not yet expired. An expired lease is never resurrected (FM-09).
-- KEYS: meta, tokens, leases, holders
-- ARGV: token, acqID, ttlMs, then the other tokens of a weighted lease (if any)
-- Returns {1, deadlineMs, nowUs} when extended (every token), {0, 0, nowUs}
-- when lost (any token no longer owned or expired; then nothing changes).

local tok, acq, ttl = ARGV[1], ARGV[2], int_arg(ARGV[3], 1, 1e12)
if not ttl then return redis.error_reply('REDSEM_ARG invalid ttl') end
local toks = {tok}
for i = 4, #ARGV do toks[#toks + 1] = ARGV[i] end
-- Reads come first: a key of the wrong type fails the script before ZADD.
local now = now_us()
local now_ms = math.floor(now / 1000)
for _, t in ipairs(toks) do
  local rec = redis.call('HGET', KEYS[4], 't:' .. t)
  local score = redis.call('ZSCORE', KEYS[3], t)
  if not rec or owner_of(rec) ~= acq or not score or tonumber(score) <= now_ms then
    return {0, 0, now}
  end
end
-- ZREM first: a write that frees memory lets the ZADD through when Redis is
-- at maxmemory with noeviction, so holders can still refresh (FM-16).
for _, t in ipairs(toks) do redis.call('ZREM', KEYS[3], t) end
for _, t in ipairs(toks) do redis.call('ZADD', KEYS[3], now_ms + ttl, t) end
return {1, now_ms + ttl, now}
