-- release_fast.lua: release.lua's common cases, run before the other
-- helpers are defined (defining them costs more than this path).
-- KEYS: meta, tokens, leases, holders
-- ARGV: token, acqID, then the other tokens of a weighted lease
-- Returns 1 (the token went back); anything else is release.lua's to
-- answer. The headers are release.lua's (TestFastPathHeaders), and
-- TestFastPathsMatchSlowPaths holds the two alike.
--
-- It serves a release of one token this acquisition owns while holders has
-- no "slow" field (no shrink drains, no collector holds the ticket): the
-- token goes back onto the list and meta is not read. Anything else (a
-- shrink's withholding, a collector, a weighted lease, a token not owned)
-- leaves the loop (break) for release.lua: with nothing changed, or, when
-- a release must settle idle expiry, done.
-- The first write (HDEL) frees memory, so a release works at OOM; a push or
-- ZREM that fails on a key of the wrong type is undone before the script
-- fails. No migrating-slot probe: Redis runs it on a migrating slot only
-- when all four keys exist there, and it touches no key it may have emptied
-- but in those undos.

-- settle_after_fast: this path released and left the idle expiry to
-- release.lua (settle_idle).
local settle_after_fast
repeat
  if #ARGV ~= 2 then break end
  local tok, acq = ARGV[1], ARGV[2]
  local h = redis.pcall('HMGET', holders_key, 't:' .. tok, 'slow', 'idle')
  if h['err'] then return fast_fail(h, holders_key) end
  local rec, slow, idle_flag = h[1], h[2], h[3]
  -- A token not owned: release.lua answers (see not_here). 124 is '|'.
  if slow or not (rec and string.sub(rec, 1, #acq) == acq and string.byte(rec, #acq + 1) == 124) then break end
  redis.call('HDEL', holders_key, 't:' .. tok, 'a:' .. acq)
  local len = redis.pcall('LPUSH', tokens_key, tok)
  if type(len) == 'table' then
    redis.call('HSET', holders_key, 't:' .. tok, rec, 'a:' .. acq, tok)
    return fast_fail(len, tokens_key)
  end
  local r = redis.pcall('ZREM', leases_key, tok)
  if type(r) == 'table' then
    redis.call('LPOP', tokens_key)
    redis.call('HSET', holders_key, 't:' .. tok, rec, 'a:' .. acq, tok)
    return fast_fail(r, leases_key)
  end
  -- The release that puts the last token back sets the idle expiry (what
  -- settle_idle does when no lease, waiter or weighted queue is left). Only
  -- a semaphore with idle expiry has holders' idle flag; a release that
  -- finds waits holding something leaves it to settle_idle. A meta of the
  -- wrong type sets nothing.
  if not idle_flag then return 1 end
  local i = redis.pcall('HMGET', meta_key, 'size', 'idle')
  local idle = not i['err'] and tonumber(i[2])
  if not idle or idle <= 0 then return 1 end
  if tonumber(i[1]) ~= len then return 1 end
  local base = string.sub(meta_key, 1, #meta_key - 4)
  if redis.call('EXISTS', leases_key, base .. 'waits', base .. 'wqueue') > 0 then
    settle_after_fast = true
    break
  end
  local t = redis.call('TIME')
  local at = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + idle)
  for _, key in ipairs({meta_key, tokens_key, holders_key}) do redis.call('PEXPIREAT', key, at) end
  redis.call('HSET', meta_key, 'exp', at)
  return 1
until true
