-- weighted.lua: helpers of acquire_n.lua, abort_n.lua, and release.lua
-- (which routes released tokens to a collector), after sweep.lua.
--
-- The weighted scripts take eight keys: meta.lua's five, then
--   pend_key       list  base.."pend:"..acqID, the collector's BLMOVE target
--   bell_key       list  base.."bell:"..acqID, the doorbell a waiter BLPOPs on
--   queue_key      list  base.."wqueue": "acqID|k" of the requests waiting
--                        for the collector ticket, oldest first
--
-- The collector ticket, meta coll = "acqID|k|have|deadlineMs|label", is
-- held by at most one weighted acquisition: only it may hold tokens before
-- it has all k, so two never each hold part of what they need. What it has
-- ("partial") are leases "acqID|0|ms|label", listed oldest first in its part
-- list (sweep.lua). It checks in at least every pollMs; the ticket's
-- deadline, also its score in waits, is that plus a margin. If it dies, the
-- sweep gives its partial leases back and the next weighted script hands
-- the ticket on. Holding a token, it holds the head of the queue:
-- release.lua gives it every released token until it has k, and rings it.
-- With all k it seals the grant: one fence and deadline, then at most STEP
-- records a run rewritten from fence 0 to that fence; meta
-- seal = "acqID|fence|deadlineMs|grantedMs|sealed|size" says how far it got.
-- A weighted acquisition is alive while its "w:" entry in waits is later
-- than now; dead queue entries are dropped when they reach the head.

-- STEP bounds the tokens a run takes or seals; a collector with more to do
-- rings its own bell and runs again at once.
local STEP = 128

local function parse_coll(s)
  if not s then return nil end
  local a, k, have, dl, label = string.match(s, '^([^|]+)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not a then return nil end
  return {acq = a, k = tonumber(k), have = tonumber(have), dl = tonumber(dl), label = label}
end

local function coll_string(c)
  return c.acq .. '|' .. c.k .. '|' .. c.have .. '|' .. fmt_int(c.dl) .. '|' .. c.label
end

local function parse_seal(s)
  if not s then return nil end
  local a, f, d, ms, n, size = string.match(s, '^([^|]+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)$')
  if not a then return nil end
  return {acq = a, fence = tonumber(f), deadline = tonumber(d), ms = tonumber(ms),
    sealed = tonumber(n), size = tonumber(size)}
end

local function seal_string(x)
  return x.acq .. '|' .. fmt_int(x.fence) .. '|' .. fmt_int(x.deadline) .. '|' .. fmt_int(x.ms)
    .. '|' .. x.sealed .. '|' .. x.size
end

local function bell_of(acq)
  return base() .. 'bell:' .. acq
end

-- ring wakes acq's BLPOP; the doorbell outlives the wait by a second at
-- most. One of the wrong type is left alone (that waiter wakes anyway).
local function ring(acq, ttl_ms)
  local b = bell_of(acq)
  local r = redis.pcall('RPUSH', b, 1)
  if type(r) ~= 'table' then redis.call('PEXPIRE', b, math.max(ttl_ms, 1) + 1000) end
end

-- lease_all leases every token of toks until deadline under the record rec,
-- a few commands per thousand tokens.
local function lease_all(toks, deadline, rec)
  for i = 1, #toks, 1000 do
    local z, h = {}, {}
    for j = i, math.min(i + 999, #toks) do
      z[#z + 1] = fmt_int(deadline)
      z[#z + 1] = toks[j]
      h[#h + 1] = 't:' .. toks[j]
      h[#h + 1] = rec
    end
    redis.call('ZADD', leases_key, unpack(z))
    redis.call('HSET', holders_key, unpack(h))
  end
end

-- push_part appends toks to the part list part, a thousand a command.
local function push_part(part, toks)
  for i = 1, #toks, 1000 do
    redis.call('RPUSH', part, unpack(toks, i, math.min(i + 999, #toks)))
  end
end

-- held_by returns the tokens of acq's granted lease (listed in "a:"..acq)
-- that it still holds: the record is acq's and the lease exists.
local function held_by(acq)
  local toks = {}
  local idx = redis.call('HGET', holders_key, 'a:' .. acq)
  if not idx then return toks end
  local listed = {}
  for tok in string.gmatch(idx, '%S+') do listed[#listed + 1] = tok end
  each_lease(listed, function(tok, rec, score)
    if rec and owner_of(rec) == acq and score then toks[#toks + 1] = tok end
  end)
  return toks
end

-- unlease forgets acq's leases on toks (freeing writes only); the caller
-- gives the tokens back afterwards.
local function unlease(acq, toks)
  for i = 1, #toks, 1000 do
    local last = math.min(i + 999, #toks)
    local fields = {}
    for j = i, last do fields[#fields + 1] = 't:' .. toks[j] end
    redis.call('ZREM', leases_key, unpack(toks, i, last))
    redis.call('HDEL', holders_key, unpack(fields))
  end
  redis.call('HDEL', holders_key, 'a:' .. acq)
end

-- pass_ticket hands the free ticket to the oldest live request of the queue
-- and rings its bell (not when it is self, whose script is running), dropping
-- dead entries. Returns the new collector's acqID, or nil (ticket free).
local function pass_ticket(now_ms, self)
  redis.call('HDEL', meta_key, 'seal')
  for _ = 1, 1000 do
    local e = redis.call('LPOP', queue_key)
    if not e then break end
    local a, k = string.match(e, '^([^|]+)|(%d+)$')
    local live = a and redis.call('ZSCORE', waits_key, 'w:' .. a)
    if live and tonumber(live) > now_ms then
      local dl = tonumber(live)
      redis.call('HSET', holders_key, 'slow', 1) -- releases read meta
      redis.call('HSET', meta_key, 'coll',
        coll_string({acq = a, k = tonumber(k), have = 0, dl = dl, label = ''}))
      if a ~= self then ring(a, dl - now_ms) end
      return a
    end
  end
  redis.call('HDEL', meta_key, 'coll')
  return nil
end

-- pop_free pops free tokens until got holds n, 1000 at most a command:
-- valid ones, not leased and not seen (seen starts as withheld_set), are
-- kept unless withheld; strays are dropped and counted. Bounded: n + 1000
-- pops at most.
local function pop_free(got, seen, n, epoch, size, over)
  local popped, strays = 0, 0
  while #got < n and popped < n + 1000 do
    local toks = redis.call('LPOP', tokens_key, math.min(n - #got, 1000))
    if not toks or #toks == 0 then break end
    popped = popped + #toks
    local scores = redis.call('ZMSCORE', leases_key, unpack(toks))
    for i, tok in ipairs(toks) do
      local free = is_valid(tok, epoch, size) and not scores[i] and not seen[tok]
      if free then seen[tok] = true end
      if not free then
        strays = strays + 1
      elseif not withhold(tok, over, seen) then
        got[#got + 1] = tok
      end
    end
  end
  if strays > 0 then redis.call('HINCRBY', meta_key, 'rejected', strays) end
end

-- take_moved takes into new what our BLMOVE moved into the pending list
-- (need at most), as pop_free does; the rest is given back.
local function take_moved(new, seen, need, epoch, size, over)
  local moved = redis.call('LRANGE', pend_key, 0, 9)
  redis.call('DEL', pend_key)
  for _, tok in ipairs(moved) do
    local free = #new < need and is_valid(tok, epoch, size) and not seen[tok]
      and not redis.call('ZSCORE', leases_key, tok)
    if free then seen[tok] = true end
    if not free then
      give_back(tok, epoch, size)
    elseif not withhold(tok, over, seen) then
      new[#new + 1] = tok
    end
  end
end

-- push_front puts toks back at the head of the list, in their order.
local function push_front(toks)
  for last = #toks, 1, -1000 do
    local batch = {}
    for i = last, math.max(last - 999, 1), -1 do batch[#batch + 1] = toks[i] end
    redis.call('LPUSH', tokens_key, unpack(batch))
  end
end

-- collected reports whether every record of toks is acq's partial lease
-- (fence 0), each token once.
local function collected(acq, toks)
  if #toks == 0 then return true end
  local fields, seen = {}, {}
  for i, tok in ipairs(toks) do
    if seen[tok] then return false end
    seen[tok] = true
    fields[i] = 't:' .. tok
  end
  local recs = redis.call('HMGET', holders_key, unpack(fields))
  local mine = acq .. '|0|'
  for i = 1, #toks do
    if not recs[i] or string.sub(recs[i], 1, #mine) ~= mine then return false end
  end
  return true
end

-- A run of acquire_n.lua: run = {acq, ttl, label, phase, now, now_ms, epoch,
-- size, due, f (the fence of a grant now), fenced (f written already)}.

-- lower_due keeps meta due at or below every score the run writes.
local function lower_due(run, t)
  if t < run.due then
    run.due = t
    redis.call('HSET', meta_key, 'due', fmt_int(t))
  end
end

-- give_pend gives back whatever a BLMOVE moved into the pending list.
local function give_pend(run)
  if run.phase ~= 'wait' then return end
  local toks = redis.call('LRANGE', pend_key, 0, 9)
  redis.call('DEL', pend_key)
  for _, tok in ipairs(toks) do give_back(tok, run.epoch, run.size) end
end

-- settled answers SETTLED: nothing leased, so the idle expiry that wake
-- took off goes back if the semaphore is idle.
local function settled(run)
  settle_idle(run.now_ms)
  return {SETTLED, 0, run.now}
end

-- grant_n leases toks (all k) now: one fence, one deadline.
local function grant_n(run, toks)
  local deadline = run.now_ms + run.ttl
  lease_all(toks, deadline, run.acq .. '|' .. fmt_int(run.f) .. '|' .. run.now_ms .. '|' .. run.label)
  local listed = table.concat(toks, ' ')
  redis.call('HSET', holders_key, 'a:' .. run.acq, listed)
  if not run.fenced then redis.call('HSET', meta_key, 'fence', fmt_int(run.f)) end
  lower_due(run, deadline)
  redis.call('ZREM', waits_key, 'w:' .. run.acq)
  return {GRANTED, run.f, deadline, run.now, listed}
end

-- settle_all gives back all the run's acquisition holds, hands the ticket on
-- and answers SETTLED: what it collected is not what it thinks (a shrink
-- while sealing, a partial lease not its own).
local function settle_all(run)
  drop_partial(run.acq, run.epoch, run.size)
  pass_ticket(run.now_ms, run.acq)
  redis.call('ZREM', waits_key, 'w:' .. run.acq)
  give_pend(run)
  return settled(run)
end
