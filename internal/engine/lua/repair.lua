-- repair.lua: restore the token inventory (Semaphore.Repair).
-- KEYS: meta, tokens, leases, holders, waits
-- ARGV: none
-- Returns {reclaimed, dropped, minted, missing, leases, records, pendLists}:
--   reclaimed  tokens of expired leases and stale pending lists put back
--              first, as reclaim.lua does
--   dropped    strangers and duplicate copies removed from the token list
--   minted     missing tokens pushed again
--   missing    slots still missing, not minted because it was unsafe
--   leases, records, pendLists
--              what made it unsafe: leases, lease records in holders
--              ("t:" and "a:" fields), pending lists that hold a token
--
-- Leases and pending lists are never touched: a stranger in a pending list
-- is dropped by its waiter's script or by the pending sweep.
--
-- The rule for minting: only when Redis records no holder at all (no lease,
-- no lease record) and no token in flight (no pending list holds one). Then
-- a missing token is held by nobody Redis knows of, and minting it cannot
-- add a permit; while anything is held or in flight, a missing token may be
-- that very one (its lease record lost or damaged), so nothing is minted.

local err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key)
if err then return redis.error_reply(err) end
local size, epoch, _
size, epoch, _, _, err = read_meta()
if err then return redis.error_reply(err) end
if not size then
  if redis.call('EXISTS', tokens_key) + redis.call('EXISTS', leases_key) > 0 then
    return redis.error_reply('REDSEM_CORRUPT ' .. meta_key .. ' is missing but tokens or leases exist')
  end
  return {0, {}, {}, {}, 0, 0, 0}
end

local due_now
due_now, err = overdue(math.floor(now_us() / 1000), 1000)
if err then return redis.error_reply(err) end
local reclaimed = reclaim(due_now, epoch, size)
redis.call('HSET', meta_key, 'due', fmt_int(next_due()))

local inv = inventory(epoch, size)
if #inv.drop > 0 then
  redis.call('DEL', tokens_key)
  for i = 1, #inv.free, 1000 do
    redis.call('RPUSH', tokens_key, unpack(inv.free, i, math.min(i + 999, #inv.free)))
  end
end

local leases = #inv.leased + #inv.retired
local records = 0
for _, f in ipairs(redis.call('HKEYS', holders_key)) do
  local kind = string.sub(f, 1, 2)
  if kind == 't:' or kind == 'a:' then records = records + 1 end
end
local minted, missing = {}, inv.missing
if #missing > 0 and leases == 0 and records == 0 and inv.pend_lists == 0 then
  for i, slot in ipairs(missing) do minted[i] = epoch .. ':' .. slot end
  for i = 1, #minted, 1000 do
    redis.call('RPUSH', tokens_key, unpack(minted, i, math.min(i + 999, #minted)))
  end
  missing = {}
end
-- The token list may be a new key now: the idle expiry is set afresh.
settle_idle(math.floor(now_us() / 1000))
return {reclaimed, inv.drop, minted, missing, leases, records, inv.pend_lists}
