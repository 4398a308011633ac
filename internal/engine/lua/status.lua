-- status.lua: a consistent, read-only snapshot of the semaphore.
-- KEYS: meta, tokens, leases, holders, waits
-- ARGV: none
-- Returns {nowUs, metaFlat, tokens, leasesWithScores, holdersFlat, waiting},
-- where waiting counts the acquisitions registered as blocked right now.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function get(key, want, cmd, ...)
  local ty = redis.call('TYPE', key)
  if type(ty) == 'table' then ty = ty['ok'] end
  if ty ~= 'none' and ty ~= want then
    return nil, 'REDSEM_WRONGTYPE ' .. key .. ' holds a ' .. ty .. ', want a ' .. want
  end
  return redis.call(cmd, key, ...), nil
end
local meta, e1 = get(meta_key, 'hash', 'HGETALL')
local toks, e2 = get(tokens_key, 'list', 'LRANGE', 0, 100000)
local leases, e3 = get(leases_key, 'zset', 'ZRANGE', 0, -1, 'WITHSCORES')
local holders, e4 = get(holders_key, 'hash', 'HGETALL')
local e5 = nil
local waiting = 0
local ty = redis.call('TYPE', waits_key)
if type(ty) == 'table' then ty = ty['ok'] end
if ty == 'zset' then
  local from = string.format('%.0f', math.floor(now / 1000))
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', waits_key, from, '+inf')) do
    if string.sub(w, 1, 2) == 'w:' then waiting = waiting + 1 end
  end
elseif ty ~= 'none' then
  e5 = 'REDSEM_WRONGTYPE ' .. waits_key .. ' holds a ' .. ty .. ', want a zset'
end
local err = e1 or e2 or e3 or e4 or e5
if err then return redis.error_reply(err) end
return {now, meta, toks, leases, holders, waiting}
