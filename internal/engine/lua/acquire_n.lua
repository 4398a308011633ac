-- acquire_n.lua: AcquireN and TryAcquireN on the server: k tokens, all or
-- nothing, under one acquisition id. Runs alone (phase "fresh", an
-- acquisition's first call) or right behind the waiter's blocking command in
-- the same write (phase "wait"):
--   BLMOVE tokens <pend> LEFT RIGHT <t>   the collector before its first token
--   BLPOP <bell> <t>                     queued for the ticket, or collecting
-- See weighted.lua for the ticket and the partial leases.
--
-- KEYS: meta, tokens, leases, holders, waits, pend, bell, queue
-- ARGV: size, acqID, k, ttlMs, label, blockMs (0: try only, never wait),
--       graceMs, tombMs, pollMs (longest sleep of a collector holding tokens),
--       phase ("fresh" or "wait"), size mode ("adopt": use the size stored
--       in meta, as acquire.lua does; anything else: fail on a mismatch)
-- Returns one of
--   {1, fence, deadlineMs, nowUs, token1, ..., tokenK}  granted
--   {0, blockMs, nowUs, mode, have}  not yet: block this long, then run again
--                                    (phase "wait"). mode 0: queued for the
--                                    ticket (BLPOP bell); 1: collector
--                                    without a token (BLMOVE); 2: collector
--                                    holding have tokens (BLPOP bell).
--                                    For blockMs 0: not now, {0, 0, nowUs, 0, 0}
--   {2, 0, nowUs}                    settled (aborted, ticket lost, or dropped
--                                    as dead): nothing held; start over
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_SIZE <stored>, REDSEM_CORRUPT,
-- REDSEM_TOOMANY <stored> (k is more than the stored size; adopt mode).

local size = int_arg(ARGV[1], 1, 100000)
local acq = ARGV[2]
local k = int_arg(ARGV[3], 1, 100000)
local ttl = int_arg(ARGV[4], 1, 1e12)
local label = ARGV[5]
local block = int_arg(ARGV[6], 0, 1e9)
local grace = int_arg(ARGV[7], 0, 1e9)
local tomb = int_arg(ARGV[8], 0, 1e9)
local poll = int_arg(ARGV[9], 1, 1e9)
local phase = ARGV[10]
if not size or not k or #acq < 16 or string.find(acq, '[|:]')
  or not ttl or not block or not grace or not tomb or not poll
  or (phase ~= 'fresh' and phase ~= 'wait') or (block == 0 and phase ~= 'fresh') then
  return redis.error_reply('REDSEM_ARG invalid arguments to acquire_n')
end
local fresh = phase == 'fresh'
-- All reads and checks come before the first write.
local err = check_types(5)
if err then return redis.error_reply(err) end
for i = 6, 8 do
  err = type_err(KEYS[i], 'list')
  if err then return redis.error_reply(err) end
end
local aborted = tombstone_of(acq) -- see acquire.lua
local now = now_us()
local now_ms = math.floor(now / 1000)

local msize, epoch, fence, due, over, _
msize, epoch, fence, due, err, _, over = read_meta()
if err then return redis.error_reply(err) end
size, err = size_in_force(msize, size, ARGV[11] == 'adopt')
if err then return redis.error_reply(err) end
if k > size then
  return redis.error_reply('REDSEM_TOOMANY ' .. size)
end

if not msize then
  -- First use, or the data was lost: create the semaphore.
  epoch, err = create(size, acq, now)
  if err then return redis.error_reply(err) end
  fence, due, over = now, NO_DUE, 0
end

-- What the sweep will give back is read (and checked) before any write.
local due_now
if msize and now_ms >= due then
  due_now, err = overdue(now_ms, 100)
  if err then return redis.error_reply(err) end
end

-- A fresh acquisition writes its fence first, so that at maxmemory it fails
-- with OOM before anything changed (see acquire.lua).
local f = math.max(fence + 1, now)
if fresh and msize then
  redis.call('HSET', KEYS[1], 'fence', fmt_int(f))
end
if not fresh then redis.call('DEL', KEYS[7]) end

if due_now then
  reclaim(due_now, epoch, size)
  due = next_due()
  redis.call('HSET', KEYS[1], 'due', fmt_int(due))
end

-- give_pend hands back whatever a BLMOVE moved into our pending list.
local function give_pend()
  if fresh then return end
  local toks = redis.call('LRANGE', KEYS[6], 0, 9)
  redis.call('DEL', KEYS[6])
  for _, tok in ipairs(toks) do give_back(tok, epoch, size) end
end

if aborted then
  give_pend()
  return {2, 0, now}
end

local coll = parse_coll(redis.call('HGET', KEYS[1], 'coll'))
if coll and coll.dl <= now_ms then
  -- The collector did not run again before its deadline: it loses the
  -- ticket and anything it collected that the sweep has not returned yet.
  local toks = held_by(coll.acq)
  unlease(coll.acq, toks)
  for _, tok in ipairs(toks) do give_back(tok, epoch, size, true) end
  redis.call('DEL', bell_of(coll.acq))
  local was_me = coll.acq == acq
  coll = nil
  redis.call('HDEL', KEYS[1], 'coll')
  if was_me then
    pass_ticket(now_ms, acq)
    redis.call('ZREM', KEYS[5], 'w:' .. acq)
    give_pend()
    return {2, 0, now}
  end
end

local function queued()
  local n = redis.call('LLEN', KEYS[8])
  return n > 0
end

-- take pops free tokens until have holds n of them. Strays are dropped and counted, as in acquire.lua.
local function take(have, n)
  local seen = {}
  for _, tok in ipairs(have) do seen[tok] = true end
  for _ = 1, n + 1000 do
    if #have >= n then break end
    local tok = redis.call('LPOP', KEYS[2])
    if not tok then break end
    if is_valid(tok, epoch, size) and not seen[tok] and not redis.call('ZSCORE', KEYS[3], tok) then
      if not withhold(tok, over) then
        seen[tok] = true
        have[#have + 1] = tok
      end
    else
      redis.call('HINCRBY', KEYS[1], 'rejected', 1)
    end
  end
end

local function grant(have)
  local deadline = now_ms + ttl
  local rec = acq .. '|' .. fmt_int(f) .. '|' .. now_ms .. '|' .. label
  local reply = {1, f, deadline, now}
  for _, tok in ipairs(have) do
    redis.call('ZADD', KEYS[3], deadline, tok)
    redis.call('HSET', KEYS[4], 't:' .. tok, rec)
    reply[#reply + 1] = tok
  end
  redis.call('HSET', KEYS[4], 'a:' .. acq, table.concat(have, ' '))
  redis.call('HSET', KEYS[1], 'fence', fmt_int(f))
  if deadline < due then redis.call('HSET', KEYS[1], 'due', deadline) end
  redis.call('ZREM', KEYS[5], 'w:' .. acq)
  return reply
end

if block == 0 then
  -- TryAcquireN: like x/sync's TryAcquire, only when no weighted request is
  -- collecting or waiting, and only all k at once.
  if coll or (queued() and pass_ticket(now_ms, acq)) then
    return {0, 0, now, 0, 0}
  end
  local have = {}
  take(have, k)
  if #have == k then return grant(have) end
  for i = #have, 1, -1 do redis.call('LPUSH', KEYS[2], have[i]) end
  return {0, 0, now, 0, 0}
end

if not (coll and coll.acq == acq) and not fresh then
  -- Queued (or dropped): alive only while our waits entry is.
  local live = redis.call('ZSCORE', KEYS[5], 'w:' .. acq)
  if not live or tonumber(live) <= now_ms then
    give_pend()
    return {2, 0, now}
  end
end

if not coll then
  local a = pass_ticket(now_ms, acq)
  if a == nil then a = acq end
  if a == acq then
    coll = {acq = acq, k = k, have = 0, dl = now_ms, label = label}
  else
    coll = parse_coll(redis.call('HGET', KEYS[1], 'coll'))
  end
end

if coll.acq ~= acq then
  -- Another request collects: wait in the ticket queue, waking by its
  -- deadline at the latest to take the ticket over if it died.
  give_pend()
  if fresh then redis.call('RPUSH', KEYS[8], acq .. '|' .. k) end
  local b = math.min(block, math.max(coll.dl - now_ms + 1, 10))
  local live = now_ms + b + grace
  redis.call('ZADD', KEYS[5], live, 'w:' .. acq)
  if live < due then redis.call('HSET', KEYS[1], 'due', live) end
  return {0, b, now, 0, 0}
end

-- We hold the ticket: keep what we hold (but for tokens a shrink retired
-- meanwhile: they are dropped, not granted), take what our BLMOVE moved,
-- then anything free.
local have, retired = {}, {}
for _, tok in ipairs(held_by(acq)) do
  if is_valid(tok, epoch, size) then have[#have + 1] = tok else retired[#retired + 1] = tok end
end
if #retired > 0 then
  unlease(acq, retired)
  returned({}, #retired)
end
local kept = #have
if not fresh then
  local moved = redis.call('LRANGE', KEYS[6], 0, 9)
  redis.call('DEL', KEYS[6])
  for _, tok in ipairs(moved) do
    if #have < k and is_valid(tok, epoch, size) and not redis.call('ZSCORE', KEYS[3], tok) then
      if not withhold(tok, over) then have[#have + 1] = tok end
    else
      give_back(tok, epoch, size)
    end
  end
end
take(have, k)

if #have == k then
  local reply = grant(have)
  pass_ticket(now_ms, acq)
  return reply
end

-- Not all yet. A collector without a token waits its turn in the token
-- queue (BLMOVE); one that holds tokens holds the head: releases come to it
-- and ring its bell, and it wakes at least every pollMs for tokens that came
-- back another way.
local mode = 1
local b = math.min(block, math.max(due - now_ms + 1, 10))
if #have > 0 then
  mode = 2
  b = math.min(b, poll)
end
local dl = now_ms + b + grace
for i, tok in ipairs(have) do
  redis.call('ZADD', KEYS[3], dl, tok)
  if i > kept then
    redis.call('HSET', KEYS[4], 't:' .. tok, acq .. '|0|' .. now_ms .. '|' .. label)
  end
end
if #have > 0 then
  redis.call('HSET', KEYS[4], 'a:' .. acq, table.concat(have, ' '))
end
coll.k, coll.have, coll.dl, coll.label = k, #have, dl, label
redis.call('HSET', KEYS[4], 'slow', 1) -- see release_fast.lua
redis.call('HSET', KEYS[1], 'coll', coll_string(coll))
redis.call('ZADD', KEYS[5], dl, 'w:' .. acq)
if dl < due then redis.call('HSET', KEYS[1], 'due', dl) end
return {0, b, now, mode, #have}
