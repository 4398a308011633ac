-- acquire_fast.lua: acquire.lua's common case, run before the other helpers
-- are defined (defining them costs more than this path).
-- KEYS: meta, tokens, leases, holders, waits, pend
-- ARGV: size, acqID, ttlMs, label, blockMs, graceMs, tombMs, phase, and
--   optionally sizeMode, idleMs
-- Returns {1, token, fence, deadlineMs, nowUs} granted, {0, blockMs, nowUs}
-- none free; anything else is acquire.lua's to answer. The headers are
-- acquire.lua's (TestFastPathHeaders), and TestFastPathsMatchSlowPaths
-- holds the two alike.
--
-- It serves a call when the semaphore exists with this size and idle time,
-- nothing is due to be swept, no shrink drains and the acquisition was not
-- aborted: a fresh call takes the head of the token list or registers as a
-- waiter; a call behind a BLMOVE takes the token the BLMOVE moved. Anything
-- else leaves the loop (break) with nothing changed, for acquire.lua.
-- A pop, lease, record or registration that fails on a key of the wrong
-- type is undone before the script fails. No migrating-slot probe: a fresh
-- call declares its pending list, which never exists, so Redis never runs it
-- on a migrating slot; a call behind a BLMOVE only touches a key it may have
-- emptied when it puts the token back.
-- Numbers are compared as digit strings where that is exact, and written as
-- Lua numbers: tonumber and string.format each cost about as much as an
-- argument of the call.

-- The grant, written once: this path and acquire.lua's grant both record a
-- lease with record_lease and its fence with set_fence, defined before the
-- loop so that the rest of the script has them too.

-- record_lease records tok's lease for acq until deadline (ms): the leases
-- entry (NX: never over a lease), then the record rec
-- ("acq|fence|grantMs|label") in holders, with holders' idle flag when
-- flag. Returns 1 recorded, 0 when tok is leased already, or a pcall error
-- and its key, with nothing written.
local function record_lease(tok, deadline, acq, rec, flag)
  local r = redis.pcall('ZADD', leases_key, 'NX', deadline, tok)
  if type(r) == 'table' then return r, leases_key end
  if r == 0 then return 0 end
  if flag then
    r = redis.pcall('HSET', holders_key, 't:' .. tok, rec, 'a:' .. acq, tok, 'idle', 1)
  else
    r = redis.pcall('HSET', holders_key, 't:' .. tok, rec, 'a:' .. acq, tok)
  end
  if type(r) == 'table' then
    redis.call('ZREM', leases_key, tok)
    return r, holders_key
  end
  return 1
end

-- set_fence writes fence (a digit string) to meta, and lowers due to
-- deadline when that is earlier (early for nothing only brings a sweep
-- forward).
local function set_fence(fence, deadline, due)
  if deadline < due then
    redis.call('HSET', meta_key, 'fence', fence, 'due', deadline)
  else
    redis.call('HSET', meta_key, 'fence', fence)
  end
end

repeat
  local size, acq, ttl_s, label = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
  local block_s, grace_s, tomb_s, phase = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
  local size_mode, idle_s = ARGV[9], ARGV[10] or '0'
  local fresh, ttl = phase == 'fresh', tonumber(ttl_s)
  -- What acquire.lua refuses, and blockMs, graceMs or tombMs of 1e9, go to it.
  if not (fresh or phase == 'wait') or not ttl or ttl < 1 or ttl > 1e12 or ttl % 1 ~= 0
    or not (string.find(size, '^[1-9]%d?%d?%d?%d?$') or size == '100000')
    or #block_s > 9 or #grace_s > 9 or #tomb_s > 9
    or not string.find(block_s .. ' ' .. grace_s .. ' ' .. tomb_s, '^%d+ %d+ %d+$')
    or #acq < 16 or string.find(acq, '|', 1, true) or string.find(acq, ':', 1, true) then
    break
  end
  local m = redis.pcall('HMGET', meta_key, 'size', 'gen', 'fence', 'due', 'over', 'x:' .. acq, 'idle', 'exp')
  if m['err'] and not fresh then break end -- acquire.lua undoes the BLMOVE first
  if m['err'] then return fast_fail(m, meta_key) end
  local msize, epoch, fence, due_s, over, tombstone, idle, exp = m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8]
  local due = tonumber(due_s)
  if msize and msize ~= size and size_mode == 'adopt'
    and (string.find(msize, '^[1-9]%d?%d?%d?%d?$') or msize == '100000') then
    size = msize
  end
  -- Now in µs and in ms, cut from TIME's digits. Ten digits of seconds
  -- (2001 to 2286) make now a 16-digit string with no leading zero.
  local t = redis.call('TIME')
  local us = t[2]
  if #us < 6 then us = string.rep('0', 6 - #us) .. us end
  local now, ms = t[1] .. us, t[1] .. string.sub(us, 1, 3)
  local now_ms = #t[1] == 10 and tonumber(ms)
  -- The fence must be digits below 9e15, so that digit strings of one
  -- length compare as numbers.
  if tombstone or msize ~= size or not epoch or not fence or not due or not now_ms or now_ms >= due
    or over or (idle or '0') ~= idle_s or not string.find(fence, '^%d+$')
    or #fence > 16 or (#fence == 16 and fence >= '9000000000000000') then
    break
  end
  -- Behind a BLMOVE, an idle semaphore (a registration swept) is
  -- acquire.lua's: it checks what may refuse the call before it wakes.
  if exp and not fresh then break end
  if exp then -- in use: no idle expiry (wake in idle.lua)
    for _, key in ipairs({meta_key, tokens_key, holders_key, waits_key}) do redis.call('PERSIST', key) end
    redis.call('HDEL', meta_key, 'exp')
  end
  -- The grant's fence: TIME in µs if above the last fence, else one more.
  local fs = now
  if #now < #fence or (#now == #fence and now <= fence) then
    fs = string.format('%.0f', tonumber(fence) + 1)
  end
  local deadline = now_ms + ttl
  -- tok: the token to grant; e and ekey: a pcall error and its key.
  local tok, e, ekey
  if fresh then
    -- The fence first (at maxmemory HSET fails: OOM before any change),
    -- with due lowered to this grant's deadline. Put back if the call fails
    -- or falls through.
    set_fence(fs, deadline, due)
    tok = redis.pcall('LPOP', tokens_key)
    if type(tok) == 'table' then e, ekey, tok = tok, tokens_key, false end
  else
    tok = redis.pcall('LPOP', pend_key)
    if type(tok) == 'table' then return fast_fail(tok, pend_key) end
  end
  if fresh and not tok and not e then
    -- None free: register as a waiter, or answer when to try again.
    local block = tonumber(block_s)
    if block == 0 then
      if due < 9e15 then return {WAITING, math.max(due - now_ms, 0), now} end
      return {WAITING, 0, now}
    end
    block = math.min(block, math.max(due - now_ms + 1, 10))
    local sweep = now_ms + block + tonumber(grace_s)
    local sw = sweep -- a due that is not whole (a stranger's) is rounded
    if sweep % 1 ~= 0 then sw = string.format('%.0f', sweep) end
    local r = redis.pcall('ZADD', waits_key, sw, 'w:' .. acq)
    if type(r) ~= 'table' then
      if sweep < due then redis.call('HSET', meta_key, 'due', sw) end
      return {WAITING, block, now}
    end
    e, ekey = r, waits_key
  end
  -- Granted only if valid: "<epoch>:<slot>" of this epoch, a canonical slot
  -- in 1..size, and not leased already (NX).
  local colon = #epoch + 1
  local ok = type(tok) == 'string' and string.byte(tok, colon) == 58
    and string.sub(tok, 1, colon - 1) == epoch and string.find(tok, '^[1-9]%d*$', colon + 1)
  if ok then
    local n = #tok - colon
    ok = n < #size or (n == #size and string.sub(tok, colon + 1) <= size)
  end
  local r
  if ok then
    -- With idle expiry, holders' idle flag too (a holders key lost on its
    -- own comes back with it).
    r, ekey = record_lease(tok, deadline, acq, acq .. '|' .. fs .. '|' .. ms .. '|' .. label, idle)
    if ekey then e = r end
    ok = r == 1
  end
  if ok and fresh then return {GRANTED, tok, fs, deadline, now} end
  if ok then
    -- Behind a BLMOVE: off the waiters, then the fence.
    r = redis.pcall('ZREM', waits_key, 'w:' .. acq)
    if type(r) ~= 'table' then
      set_fence(fs, deadline, due)
      return {GRANTED, tok, fs, deadline, now}
    end
    redis.call('HDEL', holders_key, 't:' .. tok, 'a:' .. acq)
    redis.call('ZREM', leases_key, tok)
    e, ekey = r, waits_key
  end
  -- Not granted: the token goes back where it came from. Behind a BLMOVE,
  -- that is the pending list for acquire.lua to go on with, or before an
  -- error the token list's head, as before the move (unmoved in tokens.lua);
  -- the other one if that fails (a migrating slot: the list is empty now).
  if type(tok) == 'string' and fresh then
    redis.call('LPUSH', tokens_key, tok)
  elseif type(tok) == 'string' then
    local back, other = pend_key, tokens_key
    if e then back, other = tokens_key, pend_key end
    if type(redis.pcall('LPUSH', back, tok)) == 'table' then redis.pcall('LPUSH', other, tok) end
  end
  if fresh then redis.call('HSET', meta_key, 'fence', fence, 'due', due_s) end
  if e then return fast_fail(e, ekey) end
until true
