-- acquire.lua: Acquire and TryAcquire. Runs alone, or right behind a
-- waiter's
--   BLMOVE tokens <pend> LEFT RIGHT <timeout>
-- in the same write, so that a token handed to a blocked waiter is leased
-- before the waiter reads it. acquire_fast.lua serves the common case first.
--
-- KEYS: meta, tokens, leases, holders, waits, pend (base.."pend:"..acqID)
-- ARGV: size, acqID, ttlMs, label, blockMs (0: never wait), graceMs, tombMs,
--       phase ("fresh" for an acquisition's first call, when nothing of it can
--       be pending yet; "wait" behind a BLMOVE), and optionally sizeMode
--       ("adopt": use the size stored in meta instead of failing on a
--       mismatch; anything else or none: fail), idleMs (WithIdleExpiry; 0
--       or none: off)
-- Returns one of
--   {1, token, fence, deadlineMs, nowUs}  granted
--   {0, blockMs, nowUs}                   none free: block this long, then call again
--                                         (with blockMs 0: when the next lease expires)
--   {2, 0, nowUs}                         this acquisition was aborted; nothing granted
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_SIZE <stored>, REDSEM_CORRUPT,
-- and Redis's own WRONGTYPE for a key read (or first written) before any write.

local size = int_arg(ARGV[1], 1, 100000)
local acq = ARGV[2]
local ttl = int_arg(ARGV[3], 1, 1e12)
local label = ARGV[4]
local block = int_arg(ARGV[5], 0, 1e9)
local grace = int_arg(ARGV[6], 0, 1e9)
local tomb = int_arg(ARGV[7], 0, 1e9)
local phase, size_mode = ARGV[8], ARGV[9]
local idle = int_arg(ARGV[10] or '0', 0, 1e12)
local fresh = phase == 'fresh'
if not idle or not size or #acq < 16 or string.find(acq, '[|:]')
  or not ttl or not block or not grace or not tomb
  or (phase ~= 'fresh' and phase ~= 'wait') then
  return redis.error_reply('REDSEM_ARG invalid arguments to acquire')
end
-- Off the common case (behind a BLMOVE, creating, sweeping, a shrink
-- draining) every key is type-checked before the first write, behind a
-- BLMOVE before the first read (a wrong one: the move is undone); otherwise
-- a key is checked where first touched, with pcall, and undo puts back what
-- changed before the script fails.
local err
if not fresh then
  err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key) or type_err(pend_key, 'list')
  if err then return unmoved(true, err) end
end
-- A tombstone: the client settled this acquisition (abort.lua) before this
-- call arrived. Hand back anything pending and grant nothing.
local aborted = tombstone_of(acq)

local now = now_us()
local now_ms = math.floor(now / 1000)

local msize, epoch, fence, due, over, _
msize, epoch, fence, due, err, _, over = read_meta('upgrade', size_mode ~= 'adopt' and size or nil)
if err then return unmoved(not fresh, err) end
size, err = size_in_force(msize, size, size_mode == 'adopt')
if err then return unmoved(not fresh, err) end

local due_now
if not fresh or not msize or now_ms >= due or over > 0 then
  if fresh then err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key) end
  if not err and msize and now_ms >= due then due_now, err = overdue(now_ms, 100) end
  if err then return unmoved(not fresh, err) end
end

if not msize then
  -- First use, or the data was lost: create the semaphore.
  epoch, err = create(size, acq, now)
  if err then return unmoved(not fresh, err) end
  fence, due, over = now, NO_DUE, 0
end

-- The fence of a grant by this call. A fresh acquisition writes it first:
-- at maxmemory (noeviction) HSET fails, so new acquisitions fail with OOM
-- while releases, refreshes and waiters handed a token go on.
local f = math.max(fence + 1, now)
local fenced = false
if fresh and msize then
  redis.call('HSET', meta_key, 'fence', fmt_int(f))
  fenced = true
end
-- In use from here on: no idle expiry (idle.lua).
idle_setting(idle)
wake()

-- dropped: the strangers this call popped and dropped; had_rejected:
-- whether meta had a rejected field before the first drop.
local dropped, had_rejected = {}, false

-- undo puts back the strangers dropped (at the head of the list, in their
-- order) and the fence before the call fails on e, a pcall error, and
-- returns its error reply.
local function undo(e)
  for i = #dropped, 1, -1 do redis.call('LPUSH', tokens_key, dropped[i]) end
  if #dropped > 0 and had_rejected then
    redis.call('HINCRBY', meta_key, 'rejected', -#dropped)
  elseif #dropped > 0 then
    redis.call('HDEL', meta_key, 'rejected') -- our HINCRBY made it
  end
  if fenced then redis.call('HSET', meta_key, 'fence', fmt_int(fence)) end
  local msg = e['err'] or ''
  if string.find(msg, 'WRONGTYPE') then
    return unmoved(not fresh, 'REDSEM_WRONGTYPE ' .. msg)
  end
  return unmoved(not fresh, msg)
end

if due_now then
  -- Something may have expired: sweep, then record the next due time.
  reclaim(due_now, epoch, size)
  due = next_due()
  redis.call('HSET', meta_key, 'due', fmt_int(due))
end

if aborted then
  if not fresh then
    local toks = redis.call('LRANGE', pend_key, 0, 9)
    redis.call('DEL', pend_key)
    for _, tok in ipairs(toks) do give_back(tok, epoch, size) end
  end
  settle_idle(now_ms)
  return {SETTLED, 0, now}
end

-- grant leases tok, a valid free token popped, as acquire_fast.lua does
-- (record_lease, set_fence), and takes a waiter off waits. holders' idle
-- flag is idle_setting's.
local function grant(tok)
  local deadline = now_ms + ttl
  -- Not expected to fail: tok is not leased (ZSCORE above), holders was
  -- read by tombstone_of and leases by ZSCORE (both fail the call on a
  -- wrong type), and Redis refuses no write at maxmemory once a script
  -- wrote. Should it fail, the call fails with everything put back.
  local r = record_lease(tok, deadline, acq, acq .. '|' .. fmt_int(f) .. '|' .. now_ms .. '|' .. label)
  if r ~= 1 then
    redis.call('LPUSH', tokens_key, tok)
    return undo(type(r) == 'table' and r or {err = 'REDSEM_CORRUPT ' .. tok .. ' is leased already'})
  end
  if not fresh then redis.call('ZREM', waits_key, 'w:' .. acq) end
  if deadline < due or not fenced then set_fence(fmt_int(f), deadline, due) end
  return {GRANTED, tok, f, deadline, now}
end

-- The token the BLMOVE moved into our pending list, then anything free,
-- never a copy of a token a shrink withholds (kept).
local pending, kept = not fresh, withheld_set(over)
for _ = 1, 1000 do
  local tok
  if pending then
    tok = redis.call('LPOP', pend_key)
    pending = false
    if not tok then tok = redis.call('LPOP', tokens_key) end
  else
    tok = redis.pcall('LPOP', tokens_key)
    if type(tok) == 'table' and tok['err'] then return undo(tok) end
  end
  if not tok then break end
  -- leases is first read here: of the wrong type, the token goes back.
  local leased = redis.pcall('ZSCORE', leases_key, tok)
  if type(leased) == 'table' and leased['err'] then
    redis.call('LPUSH', tokens_key, tok)
    return undo(leased)
  end
  if is_valid(tok, epoch, size) and not leased and not kept[tok] then
    if not withhold(tok, over, kept) then
      return grant(tok)
    end
  else
    if #dropped == 0 then had_rejected = redis.call('HGET', meta_key, 'rejected') ~= false end
    dropped[#dropped + 1] = tok
    redis.call('HINCRBY', meta_key, 'rejected', 1)
  end
end

if block == 0 then
  if not fresh then redis.call('ZREM', waits_key, 'w:' .. acq) end
  local retry = 0
  if due < NO_DUE then retry = math.max(due - now_ms, 0) end
  return {WAITING, retry, now}
end
-- Wake by due at the latest, to reclaim what crashed holders and waiters left.
block = math.min(block, math.max(due - now_ms + 1, 10))
local sweep = now_ms + block + grace
local r = redis.pcall('ZADD', waits_key, sweep, 'w:' .. acq)
if type(r) == 'table' and r['err'] then return undo(r) end
if sweep < due then redis.call('HSET', meta_key, 'due', sweep) end
return {WAITING, block, now}
