-- acquire_n.lua: AcquireN and TryAcquireN on the server: k tokens, all or
-- nothing, under one acquisition id. Runs alone (phase "fresh", an
-- acquisition's first call; "more", a TryAcquireN's next) or right behind
-- the waiter's blocking command in the same write (phase "wait"):
--   BLMOVE tokens <pend> LEFT RIGHT <t>   the collector before its first token
--   BLPOP <bell> <t>                     queued for the ticket, or collecting
-- See weighted.lua for the ticket, the partial leases and the sealing.
--
-- KEYS: meta, tokens, leases, holders, waits, pend, bell, queue
-- ARGV: size, acqID, k, ttlMs, label, blockMs (0: try only, never wait),
--       graceMs (how long past its wait a weighted acquisition's
--       registration, and the collector ticket, outlive it), tombMs,
--       pollMs (longest sleep of a collector: how often it checks in),
--       phase ("fresh", "wait", or "more" with blockMs 0), sizeMode
--       ("adopt": use the size stored in meta, as acquire.lua does;
--       anything else: fail on a mismatch), idleMs (WithIdleExpiry; 0: off)
-- Returns one of
--   {1, fence, deadlineMs, nowUs, token1, ..., tokenK}  granted
--   {0, blockMs, nowUs, mode, have}  not yet: block this long, then run again
--                                    (phase "wait"). mode 0: queued for the
--                                    ticket (BLPOP bell); 1: collector
--                                    without a token (BLMOVE); 2: collector
--                                    holding have tokens (BLPOP bell; rung
--                                    already when it has more to do now).
--                                    For blockMs 0: not now, {0, 0, nowUs, 0, 0},
--                                    or mode 3: collecting, run again at
--                                    once (phase "more")
--   {2, 0, nowUs}                    settled (aborted, ticket lost, or dropped
--                                    as dead): nothing held; start over
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_SIZE <stored>, REDSEM_CORRUPT,
-- REDSEM_TOOMANY <stored> (k is more than the stored size; adopt mode).
--
-- Each run costs O(1) plus O(tokens that arrived): a collector's partial
-- leases are written once, when each token arrives, and a run takes or
-- seals at most STEP tokens (weighted.lua). TryAcquireN takes and grants
-- all k in its one run when k is at most STEP; a larger k it collects as
-- the collector, STEP a run, its client running the script again at once
-- (phase "more"), and it gives everything back as soon as a run finds too
-- few free tokens.

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
local idle = int_arg(ARGV[12] or '0', 0, 1e12)
if not idle or not size or not k or #acq < 16 or string.find(acq, '[|:]')
  or not ttl or not block or not grace or not tomb or not poll
  or (phase ~= 'fresh' and phase ~= 'wait' and phase ~= 'more')
  or (phase == 'more' and block ~= 0) or (block == 0 and phase == 'wait') then
  return redis.error_reply('REDSEM_ARG invalid arguments to acquire_n')
end
local fresh = phase == 'fresh'
local try = block == 0 -- TryAcquireN: phase "fresh" or "more"
-- All reads and checks come before the first write.
local err = check_types(5)
if err then return redis.error_reply(err) end
for i = 6, 8 do
  err = type_err(KEYS[i], 'list')
  if err then return redis.error_reply(err) end
end
local part = part_of(acq)
err = type_err(part, 'list')
if err then return redis.error_reply(err) end
local aborted = tombstone_of(acq) -- see acquire.lua
local now = now_us()
local now_ms = math.floor(now / 1000)

local msize, epoch, fence, due, over, coll_s
msize, epoch, fence, due, err, coll_s, over = read_meta()
if err then return redis.error_reply(err) end
size, err = size_in_force(msize, size, ARGV[11] == 'adopt')
if err then return redis.error_reply(err) end
if k > size then
  return redis.error_reply('REDSEM_TOOMANY ' .. size)
end
local coll = parse_coll(coll_s)
local seal = parse_seal(msize and redis.call('HGET', KEYS[1], 'seal'))
-- The part list of a collector that missed its deadline is given back
-- below; one of another type is a stranger's, left alone (its leases lapse
-- by PARTIAL_MS).
local dead_part = false
if coll and coll.dl <= now_ms then
  dead_part = coll.acq == acq or not type_err(part_of(coll.acq), 'list')
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
local fenced = false
if fresh and msize then
  redis.call('HSET', KEYS[1], 'fence', fmt_int(f))
  fenced = true
end
-- In use from here on: no idle expiry (see common.lua).
idle_setting(idle)
wake()
-- The doorbell, rung for a wait (or, for a try collecting over several
-- runs, by a release that completed it) has done its work.
if not fresh then redis.call('DEL', KEYS[7]) end

if due_now then
  reclaim(due_now, epoch, size)
  due = next_due()
  redis.call('HSET', KEYS[1], 'due', fmt_int(due))
end

-- lower_due keeps meta due at or below every score this run writes.
local function lower_due(t)
  if t < due then
    due = t
    redis.call('HSET', KEYS[1], 'due', fmt_int(t))
  end
end

-- give_pend hands back whatever a BLMOVE moved into our pending list.
local function give_pend()
  if phase ~= 'wait' then return end
  local toks = redis.call('LRANGE', KEYS[6], 0, 9)
  redis.call('DEL', KEYS[6])
  for _, tok in ipairs(toks) do give_back(tok, epoch, size) end
end

-- settled answers SETTLED: this run leases nothing, and wake above took
-- any idle expiry off, so settle_idle puts it back if the semaphore is idle
-- (a late run of an aborted or dropped request on an idle semaphore).
local function settled()
  settle_idle(now_ms)
  return {SETTLED, 0, now}
end

if aborted then
  give_pend()
  return settled()
end

if coll and coll.dl <= now_ms then
  -- The collector did not run again before its deadline: it loses the
  -- ticket and anything it collected that the sweep has not returned yet.
  if dead_part then drop_partial(coll.acq, epoch, size) end
  redis.call('DEL', bell_of(coll.acq))
  redis.call('HDEL', KEYS[1], 'coll', 'seal')
  local was_me = coll.acq == acq
  coll, seal = nil, nil
  if was_me then
    pass_ticket(now_ms, acq)
    redis.call('ZREM', KEYS[5], 'w:' .. acq)
    give_pend()
    return settled()
  end
end

local function queued()
  local n = redis.call('LLEN', KEYS[8])
  return n > 0
end

-- push_front puts toks back at the head of the list, in their order.
local function push_front(toks)
  for last = #toks, 1, -1000 do
    local batch = {}
    for i = last, math.max(last - 999, 1), -1 do batch[#batch + 1] = toks[i] end
    redis.call('LPUSH', KEYS[2], unpack(batch))
  end
end

-- grant leases toks (all k) to us now: one fence, one deadline.
local function grant(toks)
  local deadline = now_ms + ttl
  lease_all(toks, deadline, acq .. '|' .. fmt_int(f) .. '|' .. now_ms .. '|' .. label)
  redis.call('HSET', KEYS[4], 'a:' .. acq, table.concat(toks, ' '))
  if not fenced then redis.call('HSET', KEYS[1], 'fence', fmt_int(f)) end
  lower_due(deadline)
  redis.call('ZREM', KEYS[5], 'w:' .. acq)
  local reply = {GRANTED, f, deadline, now}
  for _, tok in ipairs(toks) do reply[#reply + 1] = tok end
  return reply
end

if try and fresh then
  -- TryAcquireN: like x/sync's TryAcquire, only when no weighted request is
  -- collecting or waiting, and only all k at once.
  if coll or (queued() and pass_ticket(now_ms, acq)) then
    return {WAITING, 0, now, 0, 0}
  end
  if k <= STEP then
    local got = {}
    pop_free(got, {}, k, epoch, size, over)
    if #got == k then return grant(got) end
    push_front(got)
    return {WAITING, 0, now, 0, 0}
  end
  -- More than STEP: collect as the collector (below), STEP a run, unless
  -- the list is too short to give k now.
  if redis.call('LLEN', KEYS[2]) < k then return {WAITING, 0, now, 0, 0} end
  coll = {acq = acq, k = k, have = 0, dl = now_ms, label = label}
  seal = nil
elseif try and not (coll and coll.acq == acq) then
  -- A later run that lost the ticket (its client was too slow): nothing held.
  return settled()
end

if not (coll and coll.acq == acq) and not fresh then
  -- Queued (or dropped): alive only while our waits entry is.
  local live = redis.call('ZSCORE', KEYS[5], 'w:' .. acq)
  if not live or tonumber(live) <= now_ms then
    give_pend()
    return settled()
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
  seal = nil
end

if coll.acq ~= acq then
  -- Another request collects: wait in the ticket queue, waking by its
  -- deadline at the latest to take the ticket over if it died.
  give_pend()
  if fresh then redis.call('RPUSH', KEYS[8], acq .. '|' .. k) end
  local b = math.min(block, math.max(coll.dl - now_ms + 1, 10))
  local live = now_ms + b + grace
  redis.call('ZADD', KEYS[5], live, 'w:' .. acq)
  lower_due(live)
  return {WAITING, b, now, 0, 0}
end

-- We hold the ticket.
if seal and seal.acq ~= acq then seal = nil end
local have = coll.have

-- settle_all gives back everything we hold, hands the ticket on and tells
-- the client to start over: for when what we collected is no longer what
-- we think (a shrink while sealing, a partial lease that is not ours).
local function settle_all()
  drop_partial(acq, epoch, size)
  pass_ticket(now_ms, acq)
  redis.call('ZREM', KEYS[5], 'w:' .. acq)
  give_pend()
  return settled()
end

-- collected reports whether every record of toks is our partial lease
-- (fence 0), each token once. (A token listed twice, say swept and taken
-- again, fails here, or once its first copy is sealed.)
local function collected(toks)
  if #toks == 0 then return true end
  local fields, seen = {}, {}
  for i, tok in ipairs(toks) do
    if seen[tok] then return false end
    seen[tok] = true
    fields[i] = 't:' .. tok
  end
  local recs = redis.call('HMGET', KEYS[4], unpack(fields))
  local mine = acq .. '|0|'
  for i = 1, #toks do
    if not recs[i] or string.sub(recs[i], 1, #mine) ~= mine then return false end
  end
  return true
end

local budget, again = STEP, false
if not seal then
  -- Collecting: what our BLMOVE moved, then anything free, STEP at most.
  local new, seen = {}, {}
  local need = math.min(k - have, STEP)
  if phase == 'wait' then
    local moved = redis.call('LRANGE', KEYS[6], 0, 9)
    redis.call('DEL', KEYS[6])
    for _, tok in ipairs(moved) do
      if #new < need and is_valid(tok, epoch, size) and not seen[tok]
        and not redis.call('ZSCORE', KEYS[3], tok) then
        seen[tok] = true
        if not withhold(tok, over) then new[#new + 1] = tok end
      else
        give_back(tok, epoch, size)
      end
    end
  end
  pop_free(new, seen, need, epoch, size, over)
  if try and #new < need then
    -- Too few free tokens now: a try gives everything back.
    push_front(new)
    drop_partial(acq, epoch, size)
    pass_ticket(now_ms, acq)
    redis.call('ZREM', KEYS[5], 'w:' .. acq)
    return {WAITING, 0, now, 0, 0}
  end
  if have == 0 and #new == k then
    -- All at once: grant without a partial lease in between.
    local reply = grant(new)
    pass_ticket(now_ms, acq)
    return reply
  end
  if #new > 0 then
    local score = now_ms + PARTIAL_MS
    lease_all(new, score, acq .. '|0|' .. now_ms .. '|' .. label)
    push_part(part, new)
    lower_due(score)
    have = have + #new
  end
  budget = budget - #new
  again = #new == STEP and have < k

  if have == k and over > 0 then
    -- A shrink drains: tokens it retired since we collected them are
    -- dropped, never granted (once per shrink: O(k)).
    local keep, retired = {}, {}
    for _, tok in ipairs(redis.call('LRANGE', part, 0, 99999)) do
      if is_valid(tok, epoch, size) then keep[#keep + 1] = tok else retired[#retired + 1] = tok end
    end
    if #retired > 0 then
      unlease(acq, retired)
      returned({}, #retired)
      redis.call('DEL', part)
      push_part(part, keep)
      have = #keep
      again = true
    end
  end
  if have == k then
    -- All k: seal the grant, from this run on.
    seal = {acq = acq, fence = f, deadline = now_ms + ttl, ms = now_ms, sealed = 0, size = size}
    if not fenced then redis.call('HSET', KEYS[1], 'fence', fmt_int(f)) end
  end
end

if seal then
  if size < seal.size then return settle_all() end
  -- Rewrite the next records from fence 0 to the grant's, STEP at most,
  -- and one at least: the grant is recorded, with its fence, by the run that
  -- chose the fence, so that no later grant gets a lower one.
  local n = math.min(k - seal.sealed, math.max(budget, 1))
  budget = budget - n
  if n > 0 then
    local toks = redis.call('LRANGE', part, seal.sealed, seal.sealed + n - 1)
    if #toks ~= n or not collected(toks) then return settle_all() end
    lease_all(toks, seal.deadline, acq .. '|' .. fmt_int(seal.fence) .. '|' .. seal.ms .. '|' .. label)
    lower_due(seal.deadline)
    seal.sealed = seal.sealed + n
  end
  -- The grant's reply lists all k tokens: a run that took or sealed tokens
  -- as well answers it only for a k small beside what is left of its budget.
  if seal.sealed == k and (budget == STEP or budget >= k / 4) then
    local toks = redis.call('LRANGE', part, 0, 99999)
    redis.call('HSET', KEYS[4], 'a:' .. acq, table.concat(toks, ' '))
    redis.call('DEL', part)
    redis.call('ZREM', KEYS[5], 'w:' .. acq)
    pass_ticket(now_ms, acq)
    local reply = {GRANTED, seal.fence, seal.deadline, now}
    for _, tok in ipairs(toks) do reply[#reply + 1] = tok end
    return reply
  end
  redis.call('HSET', KEYS[1], 'seal', seal_string(seal))
  again = true
elseif have > 0 then
  -- The backstop: partial leases PARTIAL_MS/2 from their deadline are
  -- pushed forward, STEP at a time, oldest (the list's head) first.
  local head = redis.call('LINDEX', part, 0)
  local score = head and tonumber(redis.call('ZSCORE', KEYS[3], head))
  if head and (not score or score < now_ms + PARTIAL_MS / 2) then
    local toks = redis.call('LRANGE', part, 0, math.min(have, STEP) - 1)
    if not collected(toks) then return settle_all() end
    redis.call('LPOP', part, #toks)
    lease_all(toks, now_ms + PARTIAL_MS, acq .. '|0|' .. now_ms .. '|' .. label)
    redis.call('RPUSH', part, unpack(toks))
  end
end

-- Not all yet. A collector without a token waits its turn in the token
-- queue (BLMOVE); one that holds tokens holds the head: releases come to it
-- and ring its bell when it has all k. Either way it checks in at least
-- every pollMs, and loses the ticket graceMs after a check-in it missed.
-- With more to do at once (a full STEP taken, or sealing), it rings its own
-- bell.
local mode = 1
local b = math.min(block, math.max(due - now_ms + 1, 10), poll)
if try then
  mode = 3
elseif have > 0 then
  mode = 2
  if again then
    redis.call('RPUSH', KEYS[7], 1)
    redis.call('PEXPIRE', KEYS[7], b + grace + 1000)
  end
end
local dl = now_ms + b + grace
-- A try runs again at once, but its next run must not find its own ticket
-- dead when the grace is short: it gets a sleeping collector's check-in
-- interval too.
if try then dl = now_ms + poll + grace end
coll.k, coll.have, coll.dl, coll.label = k, have, dl, label
redis.call('HSET', KEYS[4], 'slow', 1) -- see release_fast.lua
redis.call('HSET', KEYS[1], 'coll', coll_string(coll))
redis.call('ZADD', KEYS[5], dl, 'w:' .. acq)
lower_due(dl)
return {WAITING, b, now, mode, have}
