-- rw_common.lua: helpers of the RWMutex scripts (after base.lua).
--
-- Keys (one hash tag; base = <prefix>{<name>}:rw:):
--   meta_key         hash  epoch, fence, created; writer (acqID of the write
--                          lease); timer (acqID of the head keeping time)
--   leases_key       zset  acqID -> lease deadline, ms of Redis TIME
--   holders_key      hash  "h:"..acqID -> "mode|fence|grantedMs|state|label"
--                          (mode r or w; state c, or p while a grant serve
--                          made waits for its waiter's script),
--                          "q:"..acqID -> "mode|ttlMs|graceMs|label" of a waiter
--   queue_key        list  acqIDs of the waiters, oldest first
--   waits_key        zset  "w:"..acqID -> liveness deadline (ms) of a waiter,
--                          "x:"..acqID -> tombstone deadline
--   bell_key         list  base.."bell:"..acqID, a waiter's doorbell
-- Any number of read leases or one write lease. First come, first served: a
-- request is granted at once only when nobody queues; else it queues, and
-- whichever script frees the lock grants from the head (every reader up to
-- the next writer, or one writer once no lease is out) and rings each. Such
-- a grant is provisional (p) for min(ttl, max(grace, 1s)) until its
-- waiter's script confirms it with a full TTL.

local function check_rw_types(...)
  local want = {'hash', 'zset', 'hash', 'list', 'zset', 'list'}
  for i, key in ipairs({...}) do
    local e = type_err(key, want[i])
    if e then return e end
  end
  return nil
end

local function rw_base()
  return string.sub(meta_key, 1, #meta_key - 4)
end

-- rw_state reads meta into {epoch, fence, writer}; nil when the lock does
-- not exist; nil, err when meta is unusable.
local function rw_state()
  local m = redis.call('HMGET', meta_key, 'epoch', 'fence', 'writer')
  if not m[1] and not m[2] then return nil, nil end
  local fence = tonumber(m[2])
  if not m[1] or not fence then
    return nil, 'REDSEM_CORRUPT ' .. meta_key .. ' is not a redsem rwmutex record'
  end
  if fence >= FENCE_MAX then
    return nil, 'REDSEM_CORRUPT ' .. meta_key .. ' holds fence ' .. m[2] .. ', too large to grow'
  end
  local writer = m[3]
  if writer == false then writer = nil end
  return {epoch = m[1], fence = fence, writer = writer}, nil
end

-- rw_open checks the types of the keys given, then reads meta.
local function rw_open(...)
  local err = check_rw_types(...)
  if err then return nil, err end
  return rw_state()
end

-- parse_lease splits a holder record "mode|fence|grantedMs|state|label".
local function parse_lease(rec)
  if not rec then return nil end
  local mode, fence, g, state, label = string.match(rec, '^([rw])|(%d+)|(%d+)|([cp])|(.*)$')
  if not mode then return nil end
  return {mode = mode, fence = tonumber(fence), granted = tonumber(g), state = state, label = label}
end

local function lease_string(l)
  return l.mode .. '|' .. fmt_int(l.fence) .. '|' .. fmt_int(l.granted) .. '|' .. l.state .. '|' .. l.label
end

-- parse_waiter splits a waiter record "mode|ttlMs|graceMs|label".
local function parse_waiter(rec)
  if not rec then return nil end
  local mode, ttl, grace, label = string.match(rec, '^([rw])|(%d+)|(%d+)|(.*)$')
  if not mode then return nil end
  return {mode = mode, ttl = tonumber(ttl), grace = tonumber(grace), label = label}
end

-- lease_of returns acq's lease record and deadline while Redis holds both.
local function lease_of(acq)
  local l = parse_lease(redis.call('HGET', holders_key, 'h:' .. acq))
  local score = redis.call('ZSCORE', leases_key, acq)
  if not l or not score then return nil, nil end
  return l, tonumber(score)
end

-- unlease forgets acq's lease (freeing writes only).
local function unlease(st, acq)
  redis.call('ZREM', leases_key, acq)
  redis.call('HDEL', holders_key, 'h:' .. acq)
  if st.writer == acq then
    redis.call('HDEL', meta_key, 'writer')
    st.writer = nil
  end
end

-- rw_ring wakes acq's BLPOP; a doorbell of the wrong type is left alone.
local function rw_ring(acq)
  local b = rw_base() .. 'bell:' .. acq
  local r = redis.pcall('RPUSH', b, 1)
  if type(r) ~= 'table' then redis.call('PEXPIRE', b, 60000) end
end

-- forget_waiter takes acq out of the queue and its records (freeing writes).
local function forget_waiter(acq)
  redis.call('LREM', queue_key, 0, acq)
  redis.call('HDEL', holders_key, 'q:' .. acq)
  redis.call('ZREM', waits_key, 'w:' .. acq)
  redis.call('DEL', rw_base() .. 'bell:' .. acq)
  if redis.call('HGET', meta_key, 'timer') == acq then
    redis.call('HDEL', meta_key, 'timer')
  end
end

-- rw_reclaim forgets leases past their deadline, waiters past their liveness
-- and tombstones past theirs (at most 1000 of each).
local function rw_reclaim(st, now_ms)
  for _, acq in ipairs(redis.call('ZRANGEBYSCORE', leases_key, '-inf', now_ms, 'LIMIT', 0, 1000)) do
    unlease(st, acq)
  end
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', waits_key, '-inf', now_ms, 'LIMIT', 0, 1000)) do
    if string.sub(w, 1, 2) == 'w:' then
      forget_waiter(string.sub(w, 3))
    else
      redis.call('ZREM', waits_key, w)
    end
  end
end

-- any_lease reports whether any lease is out.
local function any_lease()
  return redis.call('ZRANGE', leases_key, 0, 0)[1] ~= nil
end

-- grant records a lease of mode for acq: fence max(last+1, now), deadline
-- now_ms + dur, state c (confirmed) or p (provisional). Returns the fence.
local function grant(st, acq, mode, now, dur, state, label)
  local fence = math.max(st.fence + 1, now)
  st.fence = fence
  local now_ms = math.floor(now / 1000)
  redis.call('HSET', meta_key, 'fence', fmt_int(fence))
  if mode == 'w' then
    redis.call('HSET', meta_key, 'writer', acq)
    st.writer = acq
  end
  redis.call('ZADD', leases_key, fmt_int(now_ms + dur), acq)
  redis.call('HSET', holders_key, 'h:' .. acq, lease_string({mode = mode, fence = fence,
    granted = now_ms, state = state, label = label}))
  return fence
end

-- serve grants from the head of the queue what the leases out allow,
-- provisionally, ringing each; then the new head, rung, keeps time.
local function serve(st, now)
  local busy = any_lease()
  for _ = 1, 10000 do
    local head = redis.call('LINDEX', queue_key, 0)
    if not head then break end
    local w = parse_waiter(redis.call('HGET', holders_key, 'q:' .. head))
    if not w then
      -- No record (a stranger's entry, or one swept): drop it.
      redis.call('LPOP', queue_key)
    else
      if st.writer or (w.mode == 'w' and busy) then break end
      redis.call('LPOP', queue_key)
      redis.call('HDEL', holders_key, 'q:' .. head)
      redis.call('ZREM', waits_key, 'w:' .. head)
      grant(st, head, w.mode, now, math.min(w.ttl, math.max(w.grace, 1000)), 'p', w.label)
      rw_ring(head)
      busy = true
    end
  end
  local head = redis.call('LINDEX', queue_key, 0)
  if head and redis.call('HGET', meta_key, 'timer') ~= head then
    redis.call('HSET', meta_key, 'timer', head)
    rw_ring(head)
  end
end

-- confirm gives acq's lease l (read by lease_of) its full TTL if serve
-- granted it provisionally, and returns the granted reply.
local function confirm(st, acq, l, deadline, now, ttl)
  if l.state == 'p' then
    local now_ms = math.floor(now / 1000)
    deadline = now_ms + ttl
    l.state = 'c'
    redis.call('ZADD', leases_key, fmt_int(deadline), acq)
    redis.call('HSET', holders_key, 'h:' .. acq, lease_string(l))
  end
  return {GRANTED, st.epoch .. ':' .. l.mode, l.fence, deadline, now}
end
