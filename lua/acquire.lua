-- acquire.lua: the whole of Acquire and TryAcquire on the server.
-- Runs either alone (the fast path) or right behind a waiter's
--   BLMOVE tokens <pend> LEFT RIGHT <timeout>
-- in the same write, so that a token handed to a blocked waiter is leased on
-- the server before the waiter even reads it.
--
-- KEYS: meta, tokens, leases, holders, waits, pend (base.."pend:"..acqID)
-- ARGV: size, acqID, ttlMs, label, blockMs (0: never wait), graceMs, tombMs,
--       phase ("fresh" for an acquisition's first call, when nothing of it can
--       be pending yet; "wait" behind a BLMOVE)
-- Returns one of
--   {1, token, fence, deadlineMs, nowUs}  granted
--   {0, blockMs, nowUs}                   none free: block this long, then call again
--   {2, 0, nowUs}                         this acquisition was aborted; nothing granted
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_SIZE <stored>, REDSEM_CORRUPT.

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
-- meta, leases and waits are read before anything is written, so a wrong type
-- there fails the script cleanly; tokens, holders and the pending list may be
-- written first, so check them.
local err = type_err(KEYS[2], 'list') or type_err(KEYS[4], 'hash')
if not fresh then err = err or type_err(KEYS[6], 'list') end
if err then return redis.error_reply(err) end

local now = now_us()
local now_ms = math.floor(now / 1000)

local msize, epoch, fence
msize, epoch, fence, err = read_meta()
if err then return redis.error_reply(err) end
if msize and msize ~= size then
  return redis.error_reply('REDSEM_SIZE ' .. msize)
end
if not msize then
  -- First use, or the data was lost: create the semaphore. HSETNX is the
  -- guard; the script is atomic, so no client ever sees a half-filled list.
  if redis.call('EXISTS', KEYS[2]) + redis.call('EXISTS', KEYS[3]) + redis.call('EXISTS', KEYS[4]) > 0 then
    return redis.error_reply('REDSEM_CORRUPT ' .. KEYS[1] .. ' is missing but tokens or leases exist')
  end
  epoch = string.sub(acq, 1, 12)
  fence = now
  redis.call('HSETNX', KEYS[1], 'size', size)
  redis.call('HSET', KEYS[1], 'epoch', epoch, 'fence', fmt_int(fence), 'rejected', 0, 'created', now_ms)
  local batch = {}
  for i = 1, size do
    batch[#batch + 1] = epoch .. ':' .. i
    if #batch == 1000 or i == size then
      redis.call('RPUSH', KEYS[2], unpack(batch))
      batch = {}
    end
  end
end

local function grant(tok)
  local f = math.max(fence + 1, now)
  local deadline = now_ms + ttl
  redis.call('ZADD', KEYS[3], deadline, tok)
  redis.call('HSET', KEYS[1], 'fence', fmt_int(f))
  redis.call('HSET', KEYS[4], 't:' .. tok, acq .. '|' .. fmt_int(f) .. '|' .. now_ms .. '|' .. label, 'a:' .. acq, tok)
  return {1, tok, f, deadline, now}
end

reclaim(now_ms, epoch, size, 100)

-- A tombstone means the client gave up on this acquisition and settled it
-- (abort.lua) before this call reached Redis: a late script or a BLMOVE still
-- registered. Hand back anything pending and grant nothing.
if redis.call('ZSCORE', KEYS[5], 'x:' .. acq) then
  if not fresh then
    local toks = redis.call('LRANGE', KEYS[6], 0, 9)
    redis.call('DEL', KEYS[6])
    for _, tok in ipairs(toks) do give_back(tok, epoch, size) end
  end
  return {2, 0, now}
end
if not fresh then redis.call('ZREM', KEYS[5], 'w:' .. acq) end

-- A token the BLMOVE moved into our pending list, then anything free.
for _ = 1, 1000 do
  local tok = (not fresh and redis.call('LPOP', KEYS[6])) or redis.call('LPOP', KEYS[2])
  if not tok then break end
  if is_valid(tok, epoch, size) and not redis.call('ZSCORE', KEYS[3], tok) then
    if not fresh then redis.call('DEL', KEYS[6]) end
    return grant(tok)
  end
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
end

if block == 0 then
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  local retry = 0
  if first[2] then retry = math.max(tonumber(first[2]) - now_ms, 0) end
  return {0, retry, now}
end
-- Wake no later than the earliest lease deadline and the earliest pending
-- sweep, so that the tokens of crashed holders and of waiters that died
-- between move and lease are reclaimed by the waiters themselves.
for _, key in ipairs({KEYS[3], KEYS[5]}) do
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    block = math.min(block, math.max(tonumber(first[2]) - now_ms + 1, 10))
  end
end
redis.call('ZADD', KEYS[5], now_ms + block + grace, 'w:' .. acq)
return {0, block, now}
