-- weighted.lua: helpers of the weighted scripts (acquire_n.lua, abort_n.lua),
-- placed after common.lua by weighted.go. It defines helpers only; nothing
-- here writes until a script calls it.
--
-- Those scripts take eight keys: common.lua's five, then
--   KEYS[6] pend     list  base.."pend:"..acqID, the collector's BLMOVE destination
--   KEYS[7] bell     list  base.."bell:"..acqID, the doorbell this waiter BLPOPs on
--   KEYS[8] queue    list  base.."wqueue": "acqID|k" of the weighted requests
--                          waiting for the collector ticket, oldest first
--
-- The collector ticket is the meta field
--   coll = "acqID|k|have|deadlineMs|label"
-- held by at most one weighted acquisition: only it may hold tokens before
-- it has all k, so two weighted requests never each hold part of what they
-- need. The tokens it has so far ("partial") are leases like any other: in
-- leases with the ticket's deadline, recorded as "t:"..token ->
-- "acqID|0|ms|label" (fence 0 until granted) and listed, space-separated, in
-- "a:"..acqID. The collector pushes the deadline forward each time its script
-- runs; if it dies, its partial leases expire with the ticket and come back
-- through the ordinary reclaim, and the next weighted script hands the ticket
-- on. While the collector holds at least one token it holds the head of the
-- queue: release.lua gives every released token to it (as a partial lease)
-- until it has k, and rings its bell. release.lua parses coll itself; keep
-- the format in step with it.
--
-- A weighted acquisition is alive while its "w:"..acqID entry in waits is
-- later than now (acquire_n.lua refreshes it on every run): queue entries
-- whose entry is gone or past are dropped when they reach the head.

local function parse_coll(s)
  if not s then return nil end
  local a, k, have, dl, label = string.match(s, '^([^|]+)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not a then return nil end
  return {acq = a, k = tonumber(k), have = tonumber(have), dl = tonumber(dl), label = label}
end

local function coll_string(c)
  return c.acq .. '|' .. c.k .. '|' .. c.have .. '|' .. fmt_int(c.dl) .. '|' .. c.label
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

-- held_by returns the tokens listed for acq that it still holds: the record
-- is acq's and the lease exists.
local function held_by(acq)
  local toks = {}
  local idx = redis.call('HGET', KEYS[4], 'a:' .. acq)
  if not idx then return toks end
  for tok in string.gmatch(idx, '%S+') do
    local rec = redis.call('HGET', KEYS[4], 't:' .. tok)
    if rec and owner_of(rec) == acq and redis.call('ZSCORE', KEYS[3], tok) then
      toks[#toks + 1] = tok
    end
  end
  return toks
end

-- unlease forgets acq's leases on toks (freeing writes only); the caller
-- gives the tokens back afterwards.
local function unlease(acq, toks)
  for _, tok in ipairs(toks) do
    redis.call('ZREM', KEYS[3], tok)
    redis.call('HDEL', KEYS[4], 't:' .. tok)
  end
  redis.call('HDEL', KEYS[4], 'a:' .. acq)
end

-- pass_ticket hands the free ticket to the oldest live request of the queue
-- and rings its bell (not when it is self, whose script is running), dropping
-- dead entries. Returns the new collector's acqID, or nil (ticket free).
local function pass_ticket(now_ms, self)
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
