-- release_fast.lua: the common cases of release.lua, run before the helpers
-- of common.lua are even defined (defining them costs more than this path).
-- KEYS, ARGV and Returns: those of release.lua.
--
-- It serves a release of one token while holders has no "slow" field (no
-- shrink drains and no weighted collector holds the ticket: resize.lua and
-- weighted.lua set "slow" before they set meta over or coll; release.lua
-- drops it once both are gone): then the token just goes back onto the
-- list, and meta is not read at all. It also serves one while a shrink
-- drains and no collector holds the ticket: then it does what returned in
-- common.lua does for one token (keep the two in step), with O(1) work: a
-- valid token is withheld (meta h:<held+1>) while fewer than over are, or
-- goes onto the list; a retired one is dropped, and over falls by one,
-- letting the last withheld token go back when held exceeds it. Anything
-- else (several tokens, a collector, a token of another epoch, a damaged
-- meta, a "slow" field left after a shrink, a token this acquisition does
-- not own) falls through to release.lua.
--
-- holders and meta are read first (a key of the wrong type fails there with
-- nothing written); the first write (HDEL) frees memory, so a release works
-- when Redis is out of memory; a push or ZREM that fails on a key of the
-- wrong type is undone before the script fails, and meta (a hash, as read)
-- is written last. There is no probe for a migrating cluster slot (see
-- common.lua): the script runs on a migrating slot only when all four keys
-- it declares exist there (else Redis answers TRYAGAIN or ASK before it
-- runs), and it accesses no key it may have emptied itself but in those
-- undos (at worst a record is lost there, and its lease is swept at its
-- deadline: the token is not lost).
-- settle_after_fast: set when this path released and left the idle
-- expiry to settle_idle (release.lua, after common.lua's helpers).
local settle_after_fast
do
  if #ARGV == 2 then
    local tok, acq = ARGV[1], ARGV[2]
    local function fail(e, key)
      if string.find(e['err'], 'WRONGTYPE', 1, true) then
        return redis.error_reply('REDSEM_WRONGTYPE ' .. key .. ' is of the wrong type')
      end
      return redis.error_reply('TRYAGAIN redsem: ' .. e['err'])
    end
    local h = redis.pcall('HMGET', KEYS[4], 't:' .. tok, 'slow', 'idle')
    if h['err'] then return fail(h, KEYS[4]) end
    local rec = h[1]
    local owned = rec and string.sub(rec, 1, #acq) == acq and string.byte(rec, #acq + 1) == 124 -- 124: '|'
    -- push: the token that goes onto the list, if any; set and gone: the
    -- shrink's fields of meta to write once the rest is done. A token not
    -- owned falls through: release.lua answers that (see not_here).
    local push, set, gone, fast = tok, nil, nil, owned and not h[2]
    if owned and not fast then
      local m = redis.pcall('HMGET', KEYS[1], 'epoch', 'size', 'over', 'held', 'coll')
      if m['err'] then return fail(m, KEYS[1]) end
      local e, slot = string.match(tok, '^([^:]+):([1-9][0-9]*)$')
      local size, over, held = tonumber(m[2]), tonumber(m[3]), tonumber(m[4] or 0)
      slot = tonumber(slot)
      if m[1] and e == m[1] and not m[5] and size and over and held and slot
        and over >= 1 and over <= 100000 and over % 1 == 0
        and held >= 0 and held <= over and held % 1 == 0 then
        fast = true
        if slot <= size then
          if held < over then
            push, set = nil, {'h:' .. (held + 1), tok, 'held', held + 1}
          end
        else
          -- A retired token: dropped. over falls by one; if that leaves
          -- more withheld than over, the last withheld goes back.
          push, over, set, gone = nil, over - 1, {}, {}
          if held > over then
            push = redis.call('HGET', KEYS[1], 'h:' .. held)
            gone[#gone + 1] = 'h:' .. held
            held = held - 1
          end
          for _, f in ipairs({{'over', over}, {'held', held}}) do
            if f[2] == 0 then gone[#gone + 1] = f[1] else set[#set + 1] = f[1]; set[#set + 1] = f[2] end
          end
        end
      end
    end
    if fast then
      redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. acq)
      -- A push or ZREM that fails is undone (the token popped again if it
      -- was pushed, the record put back) before the script fails; inline,
      -- as a closure here would cost every call an allocation, and one per
      -- local it captures.
      local len = 0
      if push then
        local r = redis.pcall('LPUSH', KEYS[2], push)
        if type(r) == 'table' then
          redis.call('HSET', KEYS[4], 't:' .. tok, rec, 'a:' .. acq, tok)
          return fail(r, KEYS[2])
        end
        len = r
      end
      local r = redis.pcall('ZREM', KEYS[3], tok)
      if type(r) == 'table' then
        if push then redis.call('LPOP', KEYS[2]) end
        redis.call('HSET', KEYS[4], 't:' .. tok, rec, 'a:' .. acq, tok)
        return fail(r, KEYS[3])
      end
      if gone and #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
      if set and #set > 0 then redis.call('HSET', KEYS[1], unpack(set)) end
      -- The release that puts the last token back sets the idle expiry when
      -- meta asks for one (settle_idle in common.lua, for this case: no
      -- shrink or collector, as holders has no "slow"; no lease, no waits
      -- entry at all, no weighted queue). Only a semaphore with idle expiry
      -- has holders' "idle" flag (idle_setting in common.lua): without it,
      -- meta is not read. A release that may have ended a shrink's drain
      -- (holders has "slow"), or one that finds waits holding something
      -- (tombstones of cancelled waits, say), leaves the decision to
      -- settle_idle itself: release.lua runs it first thing when
      -- settle_after_fast is set.
      if h[3] and (h[2] or len > 0) then
        -- A meta of the wrong type (a stranger's) sets nothing.
        local i = redis.pcall('HMGET', KEYS[1], 'size', 'idle')
        local idle = not i['err'] and tonumber(i[2])
        if idle and idle > 0 then
          local base = string.sub(KEYS[1], 1, #KEYS[1] - 4)
          if h[2] then
            settle_after_fast = true
          elseif tonumber(i[1]) == len then
            if redis.call('EXISTS', KEYS[3], base .. 'waits', base .. 'wqueue') == 0 then
              local t = redis.call('TIME')
              local at = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + idle)
              for _, key in ipairs({KEYS[1], KEYS[2], KEYS[4]}) do redis.call('PEXPIREAT', key, at) end
              redis.call('HSET', KEYS[1], 'exp', at)
            else
              settle_after_fast = true
            end
          end
        end
      end
      if not settle_after_fast then return 1 end
    end
  end
end
