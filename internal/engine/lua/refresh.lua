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
-- due (see read_meta) must not be later than the new deadline, or a
-- shortened lease whose holder dies would not be swept until the old one.
local due = tonumber(redis.call('HGET', meta_key, 'due'))
local lost = each_lease(toks, function(_, rec, score)
  if not rec or owner_of(rec) ~= acq or not score or tonumber(score) <= now_ms then return true end
end)
if lost then return not_here(leases_key) or {0, 0, now} end
-- ZREM first: a write that frees memory lets the ZADD through when Redis is
-- at maxmemory with noeviction, so holders can still refresh (FM-16).
local dl = fmt_int(now_ms + ttl)
for i = 1, #toks, 1000 do
  local last = math.min(i + 999, #toks)
  redis.call('ZREM', leases_key, unpack(toks, i, last))
  local z = {}
  for j = i, last do
    z[#z + 1] = dl
    z[#z + 1] = toks[j]
  end
  redis.call('ZADD', leases_key, unpack(z))
end
if due and now_ms + ttl < due then redis.call('HSET', meta_key, 'due', dl) end
return {1, now_ms + ttl, now}
