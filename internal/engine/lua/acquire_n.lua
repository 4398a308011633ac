-- acquire_n.lua: AcquireN and TryAcquireN: k tokens, all or nothing, under
-- one acquisition id (weighted.lua: the ticket, partial leases, sealing).
-- Runs alone (phase "fresh", an acquisition's first call; "more", a
-- TryAcquireN's next) or right behind the waiter's blocking command in the
-- same write (phase "wait"):
--   BLMOVE tokens <pend> LEFT RIGHT <t>   the collector before its first token
--   BLPOP <bell> <t>                      queued for the ticket, or collecting
--
-- KEYS: meta, tokens, leases, holders, waits, pend, bell, queue
-- ARGV: size, acqID, k, ttlMs, label, blockMs (0: try only, never wait),
--       graceMs (how long the registration and the ticket outlive a wait),
--       tombMs, pollMs (how often a collector checks in at least),
--       phase ("fresh", "wait", or "more" with blockMs 0), sizeMode
--       ("adopt": use the stored size; anything else: fail on a mismatch),
--       idleMs (WithIdleExpiry; 0: off)
-- Returns one of
--   {1, fence, deadlineMs, nowUs, "token1 ... tokenK"}  granted (one string:
--                                    a reply of k elements cost Redis more)
--   {0, blockMs, nowUs, mode, have}  not yet: block this long, then run again
--                                    (phase "wait"); mode 0: queued for the
--                                    ticket (BLPOP bell); 1: collector
--                                    without a token (BLMOVE); 2: collector
--                                    holding have tokens (BLPOP bell). With
--                                    blockMs 0: {0, 0, nowUs, 0, 0}, not now,
--                                    or mode 3: run again at once ("more")
--   {2, 0, nowUs}                    settled (aborted, ticket lost, dropped
--                                    as dead): nothing held; start over
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_SIZE <stored>, REDSEM_CORRUPT,
-- REDSEM_TOOMANY <stored> (k is more than the stored size; adopt mode).
-- A run costs O(1) plus O(tokens that arrived), at most STEP taken or sealed.

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
local size_mode = ARGV[11]
local fresh = phase == 'fresh'
local try = block == 0 -- TryAcquireN: phase "fresh" or "more"
-- All reads and checks come before the first write.
local part = part_of(acq)
local err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key) or type_err(pend_key, 'list') or type_err(bell_key, 'list')
  or type_err(queue_key, 'list') or type_err(part, 'list')
if err then return unmoved(phase == 'wait', err) end
local aborted = tombstone_of(acq) -- see acquire.lua
local now = now_us()
local now_ms = math.floor(now / 1000)

local msize, epoch, fence, due, over, coll_s
msize, epoch, fence, due, err, coll_s, over = read_meta('upgrade', size_mode ~= 'adopt' and size or nil)
if err then return unmoved(phase == 'wait', err) end
size, err = size_in_force(msize, size, size_mode == 'adopt')
if err then return unmoved(phase == 'wait', err) end
if k > size then return unmoved(phase == 'wait', 'REDSEM_TOOMANY ' .. size) end
local coll = parse_coll(coll_s)
local seal = parse_seal(msize and redis.call('HGET', meta_key, 'seal'))
-- A dead collector's part list goes below (a stranger's type: left alone).
local dead_part = false
if coll and coll.dl <= now_ms then
  dead_part = coll.acq == acq or not type_err(part_of(coll.acq), 'list')
end

if not msize then
  -- First use, or the data was lost: create the semaphore.
  epoch, err = create(size, acq, now)
  if err then return unmoved(phase == 'wait', err) end
  fence, due, over = now, NO_DUE, 0
end

-- What the sweep gives back is read (and checked) before any write.
local due_now
if msize and now_ms >= due then
  due_now, err = overdue(now_ms, 100)
  if err then return unmoved(phase == 'wait', err) end
end

-- A fresh acquisition writes its fence first: at maxmemory, OOM before any change.
local f = math.max(fence + 1, now)
local fenced = false
if fresh and msize then
  redis.call('HSET', meta_key, 'fence', fmt_int(f))
  fenced = true
end
idle_setting(idle) -- in use from here on: no idle expiry
wake()
if not fresh then redis.call('DEL', bell_key) end -- the doorbell rang

if due_now then
  reclaim(due_now, epoch, size)
  due = next_due()
  redis.call('HSET', meta_key, 'due', fmt_int(due))
end

local run = {acq = acq, ttl = ttl, label = label, phase = phase, now = now, now_ms = now_ms,
  epoch = epoch, size = size, due = due, f = f, fenced = fenced}

if aborted then
  give_pend(run)
  return settled(run)
end

if coll and coll.dl <= now_ms then
  -- The collector missed its deadline: it loses the ticket and what it has.
  if dead_part then drop_partial(coll.acq, epoch, size) end
  redis.call('DEL', bell_of(coll.acq))
  redis.call('HDEL', meta_key, 'coll', 'seal')
  local was_me = coll.acq == acq
  coll, seal = nil, nil
  if was_me then
    pass_ticket(now_ms, acq)
    redis.call('ZREM', waits_key, 'w:' .. acq)
    give_pend(run)
    return settled(run)
  end
end

if try and fresh then
  -- TryAcquireN: only when no weighted request collects or waits, all k at once.
  if coll or (redis.call('LLEN', queue_key) > 0 and pass_ticket(now_ms, acq)) then
    return {WAITING, 0, now, 0, 0}
  end
  if k <= STEP then
    local got = {}
    pop_free(got, withheld_set(over), k, epoch, size, over)
    if #got == k then return grant_n(run, got) end
    push_front(got)
    return {WAITING, 0, now, 0, 0}
  end
  -- More than STEP: collect (below), STEP a run, if the list holds k now.
  if redis.call('LLEN', tokens_key) < k then return {WAITING, 0, now, 0, 0} end
  coll = {acq = acq, k = k, have = 0, dl = now_ms, label = label}
  seal = nil
elseif try and not (coll and coll.acq == acq) then
  -- A later run that lost the ticket (its client was too slow): nothing held.
  return settled(run)
end

if not (coll and coll.acq == acq) and not fresh then
  -- Queued (or dropped): alive only while our waits entry is.
  local live = redis.call('ZSCORE', waits_key, 'w:' .. acq)
  if not live or tonumber(live) <= now_ms then
    give_pend(run)
    return settled(run)
  end
end

if not coll then
  local a = pass_ticket(now_ms, acq)
  if a == nil then a = acq end
  if a == acq then
    coll = {acq = acq, k = k, have = 0, dl = now_ms, label = label}
  else
    coll = parse_coll(redis.call('HGET', meta_key, 'coll'))
  end
  seal = nil
end

if coll.acq ~= acq then
  -- Another collects: queue, waking by its deadline to take over if it died.
  give_pend(run)
  if fresh then redis.call('RPUSH', queue_key, acq .. '|' .. k) end
  local b = math.min(block, math.max(coll.dl - now_ms + 1, 10))
  local live = now_ms + b + grace
  redis.call('ZADD', waits_key, live, 'w:' .. acq)
  lower_due(run, live)
  return {WAITING, b, now, 0, 0}
end

-- We hold the ticket.
if seal and seal.acq ~= acq then seal = nil end
local have = coll.have

local budget, again = STEP, false
if not seal then
  -- Collecting: what our BLMOVE moved, then anything free, STEP at most.
  local new, seen = {}, withheld_set(over)
  local need = math.min(k - have, STEP)
  if phase == 'wait' then take_moved(new, seen, need, epoch, size, over) end
  pop_free(new, seen, need, epoch, size, over)
  if try and #new < need then
    -- Too few free tokens now: a try gives everything back.
    push_front(new)
    drop_partial(acq, epoch, size)
    pass_ticket(now_ms, acq)
    redis.call('ZREM', waits_key, 'w:' .. acq)
    return {WAITING, 0, now, 0, 0}
  end
  if have == 0 and #new == k then
    -- All at once: grant without a partial lease in between.
    local reply = grant_n(run, new)
    pass_ticket(now_ms, acq)
    return reply
  end
  if #new > 0 then
    local score = now_ms + PARTIAL_MS
    lease_all(new, score, acq .. '|0|' .. now_ms .. '|' .. label)
    push_part(part, new)
    lower_due(run, score)
    have = have + #new
  end
  budget = budget - #new
  again = #new == STEP and have < k

  if have == k and over > 0 then
    -- A shrink drains: tokens it retired since we took them are dropped.
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
    if not fenced then redis.call('HSET', meta_key, 'fence', fmt_int(f)) end
  end
end

if seal then
  if size < seal.size then return settle_all(run) end
  -- Rewrite records from fence 0 to the grant's: STEP at most, one at least.
  local n = math.min(k - seal.sealed, math.max(budget, 1))
  budget = budget - n
  if n > 0 then
    local toks = redis.call('LRANGE', part, seal.sealed, seal.sealed + n - 1)
    if #toks ~= n or not collected(acq, toks) then return settle_all(run) end
    lease_all(toks, seal.deadline, acq .. '|' .. fmt_int(seal.fence) .. '|' .. seal.ms .. '|' .. label)
    lower_due(run, seal.deadline)
    seal.sealed = seal.sealed + n
  end
  -- The reply lists all k: a run that also took or sealed tokens answers
  -- only for a k small beside its budget left.
  if seal.sealed == k and (budget == STEP or budget >= k / 4) then
    local listed = table.concat(redis.call('LRANGE', part, 0, 99999), ' ')
    redis.call('HSET', holders_key, 'a:' .. acq, listed)
    redis.call('DEL', part)
    redis.call('ZREM', waits_key, 'w:' .. acq)
    pass_ticket(now_ms, acq)
    return {GRANTED, seal.fence, seal.deadline, now, listed}
  end
  redis.call('HSET', meta_key, 'seal', seal_string(seal))
  again = true
elseif have > 0 then
  -- Partial leases within PARTIAL_MS/2 of their deadline move forward,
  -- STEP at a time, oldest first.
  local head = redis.call('LINDEX', part, 0)
  local score = head and tonumber(redis.call('ZSCORE', leases_key, head))
  if head and (not score or score < now_ms + PARTIAL_MS / 2) then
    local toks = redis.call('LRANGE', part, 0, math.min(have, STEP) - 1)
    if not collected(acq, toks) then return settle_all(run) end
    redis.call('LPOP', part, #toks)
    lease_all(toks, now_ms + PARTIAL_MS, acq .. '|0|' .. now_ms .. '|' .. label)
    redis.call('RPUSH', part, unpack(toks))
  end
end

-- Not all yet. A collector without a token waits in BLMOVE; one holding
-- tokens holds the head (releases ring it with all k). It checks in every
-- pollMs, loses the ticket graceMs after a missed one, and rings its own
-- bell with more to do at once.
local mode = 1
local b = math.min(block, math.max(run.due - now_ms + 1, 10), poll)
if try then
  mode = 3
elseif have > 0 then
  mode = 2
  if again then
    redis.call('RPUSH', bell_key, 1)
    redis.call('PEXPIRE', bell_key, b + grace + 1000)
  end
end
local dl = now_ms + b + grace
-- A try runs again at once, with a check-in interval too (not found dead).
if try then dl = now_ms + poll + grace end
coll.k, coll.have, coll.dl, coll.label = k, have, dl, label
redis.call('HSET', holders_key, 'slow', 1) -- releases read meta
redis.call('HSET', meta_key, 'coll', coll_string(coll))
redis.call('ZADD', waits_key, dl, 'w:' .. acq)
lower_due(run, dl)
return {WAITING, b, now, mode, have}
