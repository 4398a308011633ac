-- release_fast.lua: the common case of release.lua, run before the helpers
-- of common.lua are even defined (defining them costs more than this path).
-- KEYS, ARGV and Returns: those of release.lua.
--
-- It serves a release of one token while holders has no "slow" field: no
-- shrink drains and no weighted collector holds the ticket (resize.lua and
-- weighted.lua set "slow" before they set meta over or coll; release.lua
-- drops it once both are gone). Then the token just goes back onto the
-- list, and meta is not read at all. Anything else falls through to
-- release.lua.
--
-- holders is read first (a key of the wrong type fails there with nothing
-- written); the first write (HDEL) frees memory, so a release works when
-- Redis is out of memory; a push or ZREM that fails on a key of the wrong
-- type is undone before the script fails. There is no probe for a
-- migrating cluster slot (see common.lua): the script runs on a migrating
-- slot only when all four keys it declares exist there (else Redis answers
-- TRYAGAIN or ASK before it runs), and it accesses no key it may have
-- emptied itself but in those undos (at worst a record is lost there, and
-- its lease is swept at its deadline: the token is not lost).
do
  if #ARGV == 2 then
    local tok, acq = ARGV[1], ARGV[2]
    local function fail(e, key)
      if string.find(e['err'], 'WRONGTYPE', 1, true) then
        return redis.error_reply('REDSEM_WRONGTYPE ' .. key .. ' is of the wrong type')
      end
      return redis.error_reply('TRYAGAIN redsem: ' .. e['err'])
    end
    local h = redis.pcall('HMGET', KEYS[4], 't:' .. tok, 'slow')
    if h['err'] then return fail(h, KEYS[4]) end
    local rec = h[1]
    if not rec or string.sub(rec, 1, #acq + 1) ~= acq .. '|' then return 0 end
    if not h[2] then
      redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. acq)
      local r = redis.pcall('LPUSH', KEYS[2], tok)
      if type(r) == 'table' then
        redis.call('HSET', KEYS[4], 't:' .. tok, rec, 'a:' .. acq, tok)
        return fail(r, KEYS[2])
      end
      r = redis.pcall('ZREM', KEYS[3], tok)
      if type(r) == 'table' then
        redis.call('LPOP', KEYS[2])
        redis.call('HSET', KEYS[4], 't:' .. tok, rec, 'a:' .. acq, tok)
        return fail(r, KEYS[3])
      end
      return 1
    end
  end
end
