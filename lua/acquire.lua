-- acquire.lua: the whole of Acquire and TryAcquire on the server.
-- Runs either alone (the fast path) or right behind a waiter's
--   BLMOVE tokens <pend> LEFT RIGHT <timeout>
-- in the same write, so that a token handed to a blocked waiter is leased on
-- the server before the waiter even reads it.
--
-- KEYS: meta, tokens, leases, holders, waits, pend (base.."pend:"..acqID)
-- ARGV: size, acqID, ttlMs, label, blockMs (0: never wait), graceMs, tombMs,
--       phase ("fresh" for an acquisition's first call, when nothing of it can
--       be pending yet; "wait" behind a BLMOVE), and optionally "adopt" (use
--       the size stored in meta instead of failing on a mismatch)
-- Returns one of
--   {1, token, fence, deadlineMs, nowUs}  granted
--   {0, blockMs, nowUs}                   none free: block this long, then call again
--                                         (with blockMs 0: when the next lease expires)
--   {2, 0, nowUs}                         this acquisition was aborted; nothing granted
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_SIZE <stored>, REDSEM_CORRUPT,
-- and Redis's own WRONGTYPE for a key of the wrong type that is read (or
-- first written) before anything else is written.

local size = int_arg(ARGV[1], 1, 100000)
local acq = ARGV[2]
local ttl = int_arg(ARGV[3], 1, 1e12)
local label = ARGV[4]
local block = int_arg(ARGV[5], 0, 1e9)
local grace = int_arg(ARGV[6], 0, 1e9)
local tomb = int_arg(ARGV[7], 0, 1e9)
local fresh = ARGV[8] == 'fresh'
if not size or #acq < 16 or string.find(acq, '[|:]')
  or not ttl or not block or not grace or not tomb
  or (ARGV[8] ~= 'fresh' and ARGV[8] ~= 'wait') then
  return redis.error_reply('REDSEM_ARG invalid arguments to acquire')
end
-- Every key is read before it is written, except the pending list (wait
-- phase) or the token list (fresh phase), whose pop is the first write, and
-- leases, checked as it is first read: a key of the wrong type fails the
-- script before anything changed.
-- A tombstone means the client gave up on this acquisition and settled it
-- (abort.lua) before this call reached Redis: a late script, or a BLMOVE that
-- was still registered. Hand back anything pending and grant nothing.
local aborted = redis.call('HGET', KEYS[4], 'x:' .. acq)
local err

local now = now_us()
local now_ms = math.floor(now / 1000)

local msize, epoch, fence, due
msize, epoch, fence, due, err = read_meta()
if err then return redis.error_reply(err) end
if msize and msize ~= size then
  -- A client made WithAdoptSize takes the stored size (Resize changes it);
  -- its own size only creates the semaphore.
  if ARGV[9] ~= 'adopt' then
    return redis.error_reply('REDSEM_SIZE ' .. msize)
  end
  size = msize
end

if not msize then
  -- First use, or the data was lost: create the semaphore.
  epoch, err = create(size, acq, now)
  if err then return redis.error_reply(err) end
  fence, due = now, NO_DUE
end

-- The fence of a grant by this call. A fresh acquisition writes it first:
-- HSET is refused when Redis is at maxmemory under noeviction, so new
-- acquisitions then fail clearly with OOM, while releases, refreshes and
-- waiters already handed a token (whose first write frees memory) go on.
local f = math.max(fence + 1, now)
local fenced = false
if fresh and msize then
  redis.call('HSET', KEYS[1], 'fence', fmt_int(f))
  fenced = true
end

if now_ms >= due then
  -- Something may have expired: sweep, then record the next due time.
  err = type_err(KEYS[2], 'list')
  if err then return redis.error_reply(err) end
  reclaim(now_ms, epoch, size, 100)
  due = next_due()
  redis.call('HSET', KEYS[1], 'due', fmt_int(due))
end

if aborted then
  if not fresh then
    local toks = redis.call('LRANGE', KEYS[6], 0, 9)
    redis.call('DEL', KEYS[6])
    for _, tok in ipairs(toks) do give_back(tok, epoch, size) end
  end
  return {2, 0, now}
end

local function grant(tok)
  local deadline = now_ms + ttl
  redis.call('ZADD', KEYS[3], deadline, tok)
  if deadline < due then
    redis.call('HSET', KEYS[1], 'fence', fmt_int(f), 'due', deadline)
  elseif not fenced then
    redis.call('HSET', KEYS[1], 'fence', fmt_int(f))
  end
  redis.call('HSET', KEYS[4], 't:' .. tok, acq .. '|' .. fmt_int(f) .. '|' .. now_ms .. '|' .. label, 'a:' .. acq, tok)
  return {1, tok, f, deadline, now}
end

-- The token the BLMOVE moved into our pending list, then anything free.
-- One BLMOVE moves one element, and LPOP deletes the emptied list.
local pending = not fresh
for _ = 1, 1000 do
  local tok
  if pending then
    tok = redis.call('LPOP', KEYS[6])
    pending = false
    if not tok then tok = redis.call('LPOP', KEYS[2]) end
  else
    tok = redis.call('LPOP', KEYS[2])
  end
  if not tok then break end
  -- leases is first read here, after the pop: put the token back if it
  -- turns out to be of the wrong type.
  local held = redis.pcall('ZSCORE', KEYS[3], tok)
  if type(held) == 'table' and held['err'] then
    redis.call('LPUSH', KEYS[2], tok)
    return redis.error_reply('REDSEM_WRONGTYPE ' .. KEYS[3] .. ' is not a zset')
  end
  if is_valid(tok, epoch, size) and not held then
    if not fresh then redis.call('ZREM', KEYS[5], 'w:' .. acq) end
    return grant(tok)
  end
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
end

if block == 0 then
  if not fresh then redis.call('ZREM', KEYS[5], 'w:' .. acq) end
  local retry = 0
  if due < NO_DUE then retry = math.max(due - now_ms, 0) end
  return {0, retry, now}
end
-- Wake no later than the earliest lease deadline or pending sweep (due), so
-- that the tokens of crashed holders and of waiters that died between move
-- and lease are reclaimed by the waiters themselves.
block = math.min(block, math.max(due - now_ms + 1, 10))
local sweep = now_ms + block + grace
redis.call('ZADD', KEYS[5], sweep, 'w:' .. acq)
if sweep < due then redis.call('HSET', KEYS[1], 'due', sweep) end
return {0, block, now}
