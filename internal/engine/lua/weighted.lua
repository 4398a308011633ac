-- weighted.lua: helpers of the weighted scripts (acquire_n.lua, abort_n.lua)
-- and of release.lua (which routes released tokens to the collector with
-- parse_coll, lease_all, coll_string and ring, using its first four keys
-- only), placed after common.lua (registry.go). It defines helpers only;
-- nothing here writes until a script calls it.
--
-- Those scripts take eight keys: common.lua's five, then
--   KEYS[6] pend     list  base.."pend:"..acqID, the collector's BLMOVE destination
--   KEYS[7] bell     list  base.."bell:"..acqID, the doorbell this waiter BLPOPs on
--   KEYS[8] queue    list  base.."wqueue": "acqID|k" of the weighted requests
--                          waiting for the collector ticket, oldest first
-- and the collector's part list, base.."part:"..acqID (common.lua).
--
-- The collector ticket is the meta field
--   coll = "acqID|k|have|deadlineMs|label"
-- held by at most one weighted acquisition: only it may hold tokens before
-- it has all k, so two weighted requests never each hold part of what they
-- need. The tokens it has so far ("partial") are leases like any other,
-- recorded as "t:"..token -> "acqID|0|ms|label" (fence 0 until granted) and
-- listed, oldest first, in its part list; each arrives once, and costs
-- O(1) then. The collector checks in (runs its script) at least every pollMs;
-- the ticket's deadline, which is also its registration's score in waits, is
-- that plus a short margin, whatever the block time. If it dies, the sweep
-- (reclaim) gives its partial leases back once its registration lapses, and
-- the next weighted script hands the ticket on. While the collector holds at
-- least one token it holds the head of the queue: release.lua gives every
-- released token to it (as a partial lease) until it has k, and rings its
-- bell.
--
-- Once it has all k, the collector seals the grant: a fence and a lease
-- deadline are chosen once, then at most STEP records per script run are
-- rewritten from fence 0 to that fence, and the last run answers the grant.
-- The meta field
--   seal = "acqID|fence|deadlineMs|grantedMs|sealed|size"
-- says how far it got. So no run of the script costs more than about STEP
-- tokens' work, however large k is.
--
-- A weighted acquisition is alive while its "w:"..acqID entry in waits is
-- later than now (acquire_n.lua refreshes it on every run): queue entries
-- whose entry is gone or past are dropped when they reach the head.

-- STEP bounds the tokens one run of acquire_n.lua takes off the list or
-- seals; a collector with more to do rings its own bell and runs again at
-- once.
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

-- ring wakes acq's BLPOP; the doorbell outlives the wait by a second at most.
-- A doorbell of another acquisition may not have been type-checked: one of
-- the wrong type is left alone (that waiter wakes at its deadline anyway).
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
    redis.call('ZADD', KEYS[3], unpack(z))
    redis.call('HSET', KEYS[4], unpack(h))
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
  local idx = redis.call('HGET', KEYS[4], 'a:' .. acq)
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
    redis.call('ZREM', KEYS[3], unpack(toks, i, last))
    redis.call('HDEL', KEYS[4], unpack(fields))
  end
  redis.call('HDEL', KEYS[4], 'a:' .. acq)
end

-- pass_ticket hands the free ticket to the oldest live request of the queue
-- and rings its bell (not when it is self, whose script is running), dropping
-- dead entries. Returns the new collector's acqID, or nil (ticket free).
local function pass_ticket(now_ms, self)
  redis.call('HDEL', KEYS[1], 'seal')
  for _ = 1, 1000 do
    local e = redis.call('LPOP', KEYS[8])
    if not e then break end
    local a, k = string.match(e, '^([^|]+)|(%d+)$')
    local live = a and redis.call('ZSCORE', KEYS[5], 'w:' .. a)
    if live and tonumber(live) > now_ms then
      local dl = tonumber(live)
      redis.call('HSET', KEYS[4], 'slow', 1) -- see release_fast.lua
      redis.call('HSET', KEYS[1], 'coll',
        coll_string({acq = a, k = tonumber(k), have = 0, dl = dl, label = ''}))
      if a ~= self then ring(a, dl - now_ms) end
      return a
    end
  end
  redis.call('HDEL', KEYS[1], 'coll')
  return nil
end

-- pop_free pops free tokens off the list until got holds n, at most 1000 at
-- a time: valid ones not leased and not popped twice (seen) are kept, unless
-- a draining shrink withholds them (withhold); strays are dropped and
-- counted, as in acquire.lua. Bounded: n + 1000 pops at most.
local function pop_free(got, seen, n, epoch, size, over)
  local popped, strays = 0, 0
  while #got < n and popped < n + 1000 do
    local toks = redis.call('LPOP', KEYS[2], math.min(n - #got, 1000))
    if not toks or #toks == 0 then break end
    popped = popped + #toks
    local scores = redis.call('ZMSCORE', KEYS[3], unpack(toks))
    for i, tok in ipairs(toks) do
      if is_valid(tok, epoch, size) and not scores[i] and not seen[tok] then
        seen[tok] = true
        if not withhold(tok, over) then got[#got + 1] = tok end
      else
        strays = strays + 1
      end
    end
  end
  if strays > 0 then redis.call('HINCRBY', KEYS[1], 'rejected', strays) end
end
