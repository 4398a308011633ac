-- acquire_fast.lua: the common case of acquire.lua, run before the helpers
-- of common.lua are even defined (defining them costs more than this path).
-- KEYS, ARGV and Returns: those of acquire.lua.
--
-- It serves a call when the semaphore exists with this size, nothing is due
-- to be swept, no shrink drains and this acquisition was not aborted: a
-- fresh call is granted the token at the head of the list or registered as
-- a waiter; a call behind a BLMOVE is granted the token the BLMOVE moved.
-- Anything else (creation, a sweep, a shrink, a stranger token, a BLMOVE
-- that timed out, bad arguments, a tombstone) falls through to acquire.lua
-- with nothing changed.
--
-- No write is left half done. There is no probe for a migrating cluster
-- slot (see common.lua): a script runs on a migrating slot only when every
-- key it declares exists there (else Redis answers TRYAGAIN or ASK before
-- it runs), and a fresh call declares its pending list, which never exists
-- yet, so a fresh call never runs there at all. A call behind a BLMOVE may:
-- it accesses no key that it may have emptied itself but when it puts a
-- token back (see "Not granted" below). Meta is read first (a key of the wrong type
-- fails there with nothing written); a fresh call writes the fence first
-- (HSET is refused at maxmemory, so new acquisitions fail clearly with OOM);
-- a pop, lease, holder record or waiter registration that fails on a key of
-- the wrong type is undone, in reverse order, before the script fails.
do
  -- Numbers are compared as digit strings wherever that is exact: a Lua
  -- tonumber is the C library's strtod, which costs Redis as much as an
  -- argument of the call. Only what a grant computes with is converted.
  -- A number written to Redis (a deadline, a sweep time) goes to
  -- redis.call as a Lua number, not through a Lua string.format('%.0f'),
  -- which costs about 5,000 instructions: Redis prints it itself (with
  -- %.17g up to 7.0, as a whole number from 7.2), the digits of %.0f for
  -- whole numbers below 2^53.
  local size, acq, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
  local fresh = ARGV[8] == 'fresh'
  -- size: 1 to 100000, canonical; blockMs, graceMs, tombMs: 0 to
  -- 999999999 (1e9 itself, or anything else, falls through to acquire.lua,
  -- which takes what it accepts or refuses it).
  if (fresh or ARGV[8] == 'wait') and ttl and ttl >= 1 and ttl <= 1e12 and ttl % 1 == 0
    and (string.find(size, '^[1-9]%d?%d?%d?%d?$') or size == '100000')
    and #ARGV[5] <= 9 and #ARGV[6] <= 9 and #ARGV[7] <= 9
    and string.find(ARGV[5] .. ' ' .. ARGV[6] .. ' ' .. ARGV[7], '^%d+ %d+ %d+$')
    and #acq >= 16 and not string.find(acq, '|', 1, true) and not string.find(acq, ':', 1, true) then
    local function fail(e, key)
      if string.find(e['err'], 'WRONGTYPE', 1, true) then
        return redis.error_reply('REDSEM_WRONGTYPE ' .. key .. ' is of the wrong type')
      end
      return redis.error_reply('TRYAGAIN redsem: ' .. e['err'])
    end
    -- x: a tombstone, see acquire.lua.
    local m = redis.pcall('HMGET', KEYS[1], 'size', 'epoch', 'fence', 'due', 'over', 'x:' .. acq, 'idle', 'exp')
    if m['err'] then return fail(m, KEYS[1]) end
    local msize, epoch, fence, due = m[1], m[2], m[3], tonumber(m[4])
    if msize and msize ~= size and ARGV[9] == 'adopt'
      and (string.find(msize, '^[1-9]%d?%d?%d?%d?$') or msize == '100000') then
      size = msize
    end
    -- Now in µs and in ms, cut from TIME's digits.
    local t = redis.call('TIME')
    local us = t[2]
    if #us < 6 then us = string.rep('0', 6 - #us) .. us end
    local now, ms = t[1] .. us, t[1] .. string.sub(us, 1, 3)
    -- Ten digits of seconds (2001 to 2286): then now is a 16-digit string
    -- with no leading zero, as the comparisons below need. Any other TIME
    -- (a test server's clock set near 1970, say) falls through.
    local now_ms = #t[1] == 10 and tonumber(ms)
    -- fence: digits, below 9e15 (16 digits at most, so that digit strings
    -- compare as numbers when their lengths are equal).
    if not m[6] and msize == size and epoch and fence and due and now_ms and now_ms < due and not m[5]
      and (m[7] or '0') == (ARGV[10] or '0')
      and string.find(fence, '^%d+$') and (#fence < 16 or (#fence == 16 and fence < '9000000000000000')) then
      -- The idle expiry goes (see wake in common.lua) before anything is
      -- written: no key of a semaphore in use expires, and none that an
      -- undo below writes again comes back without the others' TTL.
      if m[8] then
        for _, i in ipairs({1, 2, 4, 5}) do redis.call('PERSIST', KEYS[i]) end
        redis.call('HDEL', KEYS[1], 'exp')
      end
      -- The fence of a grant: Redis TIME in µs when it is above the last
      -- fence (a longer digit string, or a greater one of the same length:
      -- leading zeros in the stored fence only make TIME lose to it), or
      -- one more than the last.
      local fs = now
      if #now < #fence or (#now == #fence and now <= fence) then
        fs = string.format('%.0f', tonumber(fence) + 1)
      end
      local deadline = now_ms + ttl
      -- A popped token is granted only if valid: "<epoch>:<slot>" of this
      -- epoch with a canonical slot in 1..size (digit strings of one length
      -- compare as numbers). That is checked inline, as is all else below:
      -- the only closure this path makes is fail, which captures nothing
      -- (a closure costs Redis an allocation, and one more per local it
      -- captures, on every call).
      local colon = #epoch + 1
      -- tok: the token to grant, popped from the token list (a fresh
      -- call) or from the pending list a BLMOVE filled (a call behind
      -- it); e and ekey: a pcall error on the way and the key it came
      -- from. A fresh call writes the fence first: due falls to the
      -- deadline of this grant, if there is one (a due that is early for
      -- nothing only brings a sweep forward). A fresh call that registers
      -- as a waiter or answers when to try again keeps them; one that
      -- fails or falls through to acquire.lua puts fence and due back.
      local tok, e, ekey
      if fresh then
        if deadline < due then
          redis.call('HSET', KEYS[1], 'fence', fs, 'due', deadline)
        else
          redis.call('HSET', KEYS[1], 'fence', fs)
        end
        tok = redis.pcall('LPOP', KEYS[2])
        if type(tok) == 'table' then
          e, ekey = tok, KEYS[2]
        elseif not tok then
          -- None free: register as a waiter, or answer when to try again.
          local block = tonumber(ARGV[5])
          if block == 0 then
            if due < 9e15 then return {WAITING, math.max(due - now_ms, 0), now} end
            return {WAITING, 0, now}
          end
          block = math.min(block, math.max(due - now_ms + 1, 10))
          local sweep = now_ms + block + tonumber(ARGV[6])
          -- A due that is not whole (only a stranger writes one) can make
          -- sweep a fraction: that is rounded, as it always was.
          local sw = sweep
          if sweep % 1 ~= 0 then sw = string.format('%.0f', sweep) end
          local r = redis.pcall('ZADD', KEYS[5], sw, 'w:' .. acq)
          if type(r) ~= 'table' then
            if sweep < due then redis.call('HSET', KEYS[1], 'due', sw) end
            return {WAITING, block, now}
          end
          e, ekey = r, KEYS[5]
        end
      else
        tok = redis.pcall('LPOP', KEYS[6])
        if type(tok) == 'table' then return fail(tok, KEYS[6]) end
      end
      if type(tok) == 'string' then
        if string.byte(tok, colon) == 58 and string.sub(tok, 1, colon - 1) == epoch
          and string.find(tok, '^[1-9]%d*$', colon + 1) then
          local n = #tok - colon
          if n < #size or (n == #size and string.sub(tok, colon + 1) <= size) then
            -- NX: a token that is leased already is a duplicate, not granted.
            local r = redis.pcall('ZADD', KEYS[3], 'NX', deadline, tok)
            if r == 1 then
              -- The holder record, "acqID|fence|grantedMs|label". With
              -- idle expiry on, holders' "idle" flag too (see idle_setting
              -- in common.lua): a holders key lost on its own (evicted,
              -- deleted) comes back with it, so the release that leaves the
              -- semaphore idle still sets the expiry.
              local rec = acq .. '|' .. fs .. '|' .. ms .. '|' .. ARGV[4]
              if m[7] then
                r = redis.pcall('HSET', KEYS[4], 't:' .. tok, rec, 'a:' .. acq, tok, 'idle', 1)
              else
                r = redis.pcall('HSET', KEYS[4], 't:' .. tok, rec, 'a:' .. acq, tok)
              end
              if type(r) == 'table' then
                redis.call('ZREM', KEYS[3], tok)
                e, ekey = r, KEYS[4]
              elseif fresh then
                return {GRANTED, tok, fs, deadline, now}
              else
                -- Behind a BLMOVE: off the waiters, then the fence.
                r = redis.pcall('ZREM', KEYS[5], 'w:' .. acq)
                if type(r) ~= 'table' then
                  if deadline < due then
                    redis.call('HSET', KEYS[1], 'fence', fs, 'due', deadline)
                  else
                    redis.call('HSET', KEYS[1], 'fence', fs)
                  end
                  return {GRANTED, tok, fs, deadline, now}
                end
                redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. acq)
                redis.call('ZREM', KEYS[3], tok)
                e, ekey = r, KEYS[5]
              end
            elseif type(r) == 'table' then
              e, ekey = r, KEYS[3]
            end
          end
        end
        -- Not granted: the token goes back where it came from, for the
        -- error below or (a stranger or a duplicate) for acquire.lua. A
        -- fresh call popped it from the token list. Behind a BLMOVE it
        -- goes back to the pending list, or, before an error, if that
        -- fails on a migrating slot (the list is empty now), to the token
        -- list, which existed when the script began and this call did not
        -- touch.
        if fresh then
          redis.call('LPUSH', KEYS[2], tok)
        elseif type(redis.pcall('LPUSH', KEYS[6], tok)) == 'table' and e then
          redis.pcall('LPUSH', KEYS[2], tok)
        end
      end
      if fresh then redis.call('HSET', KEYS[1], 'fence', m[3], 'due', m[4]) end
      if e then return fail(e, ekey) end
    end
  end
end
