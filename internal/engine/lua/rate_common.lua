-- rate_common.lua: helpers of the rate gate's scripts, placed after
-- common.lua by scripts.go. It defines helpers only; nothing here writes
-- until a script calls it.
--
-- A gate has one to MAX_LIMITS limits ("at most n units in any window of
-- per"); a start takes w[i] units of limit i, all at once or none. Key
-- layout (one hash tag; base = <prefix>{<name>}:rate:):
--   KEYS[1]    meta     hash  limits (how many; 1 when absent); for limit i,
--                             with s(1) = '' and s(i) = ':'..i otherwise:
--                             size..s(i) (n), per..s(i) (µs), sum..s(i) (units
--                             granted so far), back..s(i) (how many of those
--                             left the window); fence (the last grant time,
--                             µs), set (1 once rate_set.lua wrote the rate:
--                             every client follows it), changed, rejected,
--                             created, timer (the queue head that keeps time)
--   KEYS[2]    holders  hash  "g:"..acqID -> "grantUs w1 .. wL": a grant, kept
--                             while it is in a window or not yet collected by
--                             its waiter; "r:"..acqID -> "w1 .. wL": what a
--                             queued waiter asks for
--   KEYS[3]    queue    list  acqIDs of blocked waiters, oldest first
--   KEYS[4]    waits    zset  "w:"..acqID -> liveness deadline (µs) of a queued
--                             or served waiter, "x:"..acqID -> tombstone deadline
--   KEYS[4+i]  log i    zset  acqID -> sum..s(i) right after its grant, for the
--                             grants still in limit i's window (MAX_LIMITS keys
--                             are always passed; those above limits stay empty)
--   KEYS[9]    inbox    list  base.."in:"..acqID, the doorbell a waiter BLPOPs on
--
-- Units in the window of limit i: used = sum - back. A grant of w units adds
-- w to sum and logs the grant under the new sum; the grant leaves the window
-- when Redis TIME reaches its grant time plus per (expire), and back becomes
-- its logged sum. Because log scores are running sums, the grant whose
-- leaving frees k more units is found with one ZRANGEBYSCORE (ready_at), and
-- Allow's retry-after is exact for any w. Grant times strictly increase, so
-- grants leave in log order.
--
-- A change to a longer per (rate_set.lua) puts a made-up grant FORGOTTEN..i,
-- dated when the grants the gate forgot end, before the first entry of
-- log i: it stands for them until it leaves the window, and back then may
-- be below 0.
--
-- common.lua's helpers used here: now_us, int_arg, fmt_int, type_err, base.

local MAX_LIMITS = 4
local MAX_UNITS = 1000000000
-- Log scores are doubles, exact up to 2^53; a limit whose sum passes REBASE
-- has every score of its log moved down by back (see grant).
local REBASE = 2 ^ 50
-- The acqID of limit i's made-up grant is FORGOTTEN..i; a client's is hex.
local FORGOTTEN = 'forgotten:'

local function sfx(i)
  if i == 1 then return '' end
  return ':' .. i
end

local function log_key(i)
  return KEYS[4 + i]
end

-- check_rate_types checks the first nkeys keys of the layout above.
local function check_rate_types(nkeys)
  local want = {'hash', 'hash', 'list', 'zset', 'zset', 'zset', 'zset', 'zset', 'list'}
  for i = 1, nkeys do
    local e = type_err(KEYS[i], want[i])
    if e then return e end
  end
  return nil
end

local function inbox_of(acq)
  return base() .. 'in:' .. acq
end

local function words(s)
  local out = {}
  for x in string.gmatch(s, '%S+') do out[#out + 1] = x end
  return out
end

-- read_limits parses L triples or pairs of ARGV from position at: n, perUs
-- (and units when with_units). Returns rate {L, n, per} and units, or nil.
local function read_limits(L, at, with_units)
  local rate, w, any = {L = L, n = {}, per = {}}, {}, false
  local step = 2
  if with_units then step = 3 end
  for i = 1, L do
    local j = at + (i - 1) * step
    rate.n[i] = int_arg(ARGV[j], 1, MAX_UNITS)
    rate.per[i] = int_arg(ARGV[j + 1], 1, 1e13)
    if not rate.n[i] or not rate.per[i] then return nil end
    if with_units then
      w[i] = int_arg(ARGV[j + 2], 0, MAX_UNITS)
      if not w[i] then return nil end
      any = any or w[i] > 0
    end
  end
  if with_units and not any then return nil end
  return rate, w
end

-- rate_err is the mismatch reply: the stored limits, for the client's
-- *MismatchError.
local function rate_err(st)
  local parts = {'REDSEM_RATE', st.L}
  for i = 1, st.L do
    parts[#parts + 1] = fmt_int(st.n[i])
    parts[#parts + 1] = fmt_int(st.per[i])
  end
  return table.concat(parts, ' ')
end

-- differs reports whether rate a and state st name other limits.
local function differs(st, a)
  if st.L ~= a.L then return true end
  for i = 1, st.L do
    if st.n[i] ~= a.n[i] or st.per[i] ~= a.per[i] then return true end
  end
  return false
end

-- too_large returns the first limit whose n in rate r is below w, or nil.
local function too_large(r, w)
  for i = 1, r.L do
    if w[i] > r.n[i] then return i end
  end
  return nil
end

local function too_large_err(r, w, i)
  return 'REDSEM_TOOLARGE ' .. i .. ' ' .. fmt_int(w[i]) .. ' ' .. fmt_int(r.n[i]) .. ' ' .. fmt_int(r.per[i])
end

-- grant_of returns the grant time and units of acq's grant, or nil.
local function grant_of(acq, L)
  local rec = redis.call('HGET', KEYS[2], 'g:' .. acq)
  if not rec then return nil end
  local f = words(rec)
  local g = tonumber(f[1])
  if not g or #f ~= L + 1 then return nil end
  local w = {}
  for i = 1, L do
    w[i] = tonumber(f[i + 1])
    if not w[i] then return nil end
  end
  return g, w
end

-- request_of returns what queued waiter acq asks for, or nil.
local function request_of(acq, L)
  local rec = redis.call('HGET', KEYS[2], 'r:' .. acq)
  if not rec then return nil end
  local f = words(rec)
  if #f ~= L then return nil end
  local w = {}
  for i = 1, L do
    w[i] = int_arg(f[i], 0, MAX_UNITS)
    if not w[i] then return nil end
  end
  return w
end

local function save_limit(st, i)
  redis.call('HSET', KEYS[1], 'sum' .. sfx(i), fmt_int(st.sum[i]), 'back' .. sfx(i), fmt_int(st.back[i]))
end

-- create writes meta for rate r at Redis time now. Grants or a log without
-- meta are corruption (meta lost while grants lived).
local function create(r, now, set)
  local n = redis.call('EXISTS', KEYS[2])
  for i = 1, MAX_LIMITS do n = n + redis.call('EXISTS', log_key(i)) end
  if n > 0 then
    return nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' is missing but grants exist'
  end
  local st = {L = r.L, n = {}, per = {}, sum = {}, back = {}, fence = now, set = set}
  local f = {'limits', r.L, 'fence', fmt_int(now), 'rejected', 0, 'created', math.floor(now / 1000)}
  if set then
    f[#f + 1] = 'set'
    f[#f + 1] = 1
    f[#f + 1] = 'changed'
    f[#f + 1] = fmt_int(now)
  end
  for i = 1, r.L do
    st.n[i], st.per[i], st.sum[i], st.back[i] = r.n[i], r.per[i], 0, 0
    for _, kv in ipairs({{'size', r.n[i]}, {'per', r.per[i]}, {'sum', 0}, {'back', 0}}) do
      f[#f + 1] = kv[1] .. sfx(i)
      f[#f + 1] = fmt_int(kv[2])
    end
  end
  redis.call('HSET', KEYS[1], unpack(f))
  return st, nil
end

-- upgrade turns a gate of the token layout (redsem v0.1.0: "epoch" in meta,
-- a list of free start tokens, one lease per start) into this layout
-- without reading its leases: it counts the old window as full, n units
-- granted at the last grant time, so nothing is admitted above the old
-- rate, and capacity comes back at most one window after the last old
-- start. The old tokens, leases and records go; a client of v0.1.0 then
-- fails with REDSEM_CORRUPT (no epoch) instead of sharing the gate.
-- tokens and leases are not among KEYS: they share the hash tag, so they
-- live in this slot.
local function upgrade(m)
  local n, per, fence = tonumber(m[5]), tonumber(m[6]), tonumber(m[2])
  if not n or n < 1 or not per or per < 1 or not fence then
    return 'REDSEM_CORRUPT ' .. KEYS[1] .. ' is not a redsem rate gate record'
  end
  redis.call('DEL', base() .. 'tokens', base() .. 'leases', KEYS[2])
  redis.call('HDEL', KEYS[1], 'epoch', 'timer')
  redis.call('HSET', KEYS[1], 'limits', 1, 'sum', fmt_int(n), 'back', 0)
  redis.call('ZADD', log_key(1), fmt_int(n), 'upgrade')
  redis.call('HSET', KEYS[2], 'g:upgrade', fmt_int(fence) .. ' ' .. fmt_int(n))
  return nil
end

-- rate_state reads meta into {L, n, per, sum, back, fence, set}: nil when
-- the gate does not exist; nil, err when meta is unusable.
local function rate_state()
  local m = redis.call('HMGET', KEYS[1], 'limits', 'fence', 'set', 'epoch', 'size', 'per')
  if not m[1] and not m[2] and not m[4] and not m[5] then return nil, nil end
  if m[4] then
    local e = upgrade(m)
    if e then return nil, e end
    m[1] = '1'
  end
  local L, fence = int_arg(m[1] or '1', 1, MAX_LIMITS), tonumber(m[2])
  if not L or not fence then
    return nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' is not a redsem rate gate record'
  end
  if fence >= FENCE_MAX then
    return nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' holds grant time ' .. m[2] .. ', too large to grow'
  end
  local st = {L = L, n = {}, per = {}, sum = {}, back = {}, fence = fence, set = m[3] == '1'}
  local f = {}
  for i = 1, L do
    for _, name in ipairs({'size', 'per', 'sum', 'back'}) do f[#f + 1] = name .. sfx(i) end
  end
  local v = redis.call('HMGET', KEYS[1], unpack(f))
  for i = 1, L do
    local j = (i - 1) * 4
    st.n[i], st.per[i] = tonumber(v[j + 1]), tonumber(v[j + 2])
    st.sum[i], st.back[i] = tonumber(v[j + 3]), tonumber(v[j + 4])
    if not st.n[i] or st.n[i] < 1 or not st.per[i] or st.per[i] < 1 or not st.sum[i]
      or not st.back[i] or st.back[i] > st.sum[i] then
      return nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' is not a redsem rate gate record'
    end
  end
  return st, nil
end

local function used(st, i)
  return st.sum[i] - st.back[i]
end

local function fits(st, w)
  for i = 1, st.L do
    if w[i] > 0 and used(st, i) + w[i] > st.n[i] then return false end
  end
  return true
end

-- forget drops acq's grant record once no log holds it and no waiter is
-- still to collect it.
local function forget(st, acq)
  for i = 1, st.L do
    if redis.call('ZSCORE', log_key(i), acq) then return end
  end
  if redis.call('ZSCORE', KEYS[4], 'w:' .. acq) then return end
  redis.call('HDEL', KEYS[2], 'g:' .. acq)
end

-- expire ends, in log order, the grants whose window has passed: grant
-- time + per <= now. An entry without a grant record (not written by these
-- scripts) goes too, and is counted in rejected.
local function expire(st, now)
  for i = 1, st.L do
    local key, changed = log_key(i), false
    for _ = 1, 1000 do
      local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      if not first[1] then break end
      local g = grant_of(first[1], st.L)
      if g and g + st.per[i] > now then break end
      if not g then redis.call('HINCRBY', KEYS[1], 'rejected', 1) end
      redis.call('ZREM', key, first[1])
      st.back[i] = math.min(math.max(st.back[i], tonumber(first[2]) or 0), st.sum[i])
      changed = true
      if g then forget(st, first[1]) end
    end
    if changed and redis.call('EXISTS', key) == 0 then
      -- Nothing in the window: start the running sum over.
      st.sum[i], st.back[i] = 0, 0
    end
    if changed then save_limit(st, i) end
  end
end

-- rebase moves every score of limit i's log, and its sum, down by back.
local function rebase(st, i)
  local key, b = log_key(i), st.back[i]
  local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  for j = 1, #all, 2 do
    redis.call('ZADD', key, fmt_int(tonumber(all[j + 1]) - b), all[j])
  end
  st.sum[i], st.back[i] = st.sum[i] - b, 0
end

-- grant records a start of acq taking w at Redis time now (or just after
-- the last grant, so grant times strictly increase) and returns its time.
local function grant(st, acq, w, now)
  local g = math.max(st.fence + 1, now)
  st.fence = g
  local rec = {fmt_int(g)}
  for i = 1, st.L do
    rec[#rec + 1] = fmt_int(w[i])
    if w[i] > 0 then
      if st.sum[i] >= REBASE then rebase(st, i) end
      st.sum[i] = st.sum[i] + w[i]
      redis.call('ZADD', log_key(i), fmt_int(st.sum[i]), acq)
      save_limit(st, i)
    end
  end
  redis.call('HSET', KEYS[1], 'fence', fmt_int(g))
  redis.call('HSET', KEYS[2], 'g:' .. acq, table.concat(rec, ' '))
  return g
end

-- refund takes acq's w units of limit i out of the window (a start the
-- client never learnt of): the later grants' running sums move down by w.
-- More than 1000 later grants are left alone: the units then come back
-- when the grant's window ends. Reports whether limit i holds none of acq.
local function refund(st, i, acq, w)
  local key = log_key(i)
  local s = redis.call('ZSCORE', key, acq)
  if not s then return true end
  local later = redis.call('ZRANGEBYSCORE', key, '(' .. s, '+inf', 'LIMIT', 0, 1001)
  if #later > 1000 then return false end
  for _, m in ipairs(later) do
    redis.call('ZINCRBY', key, -w, m)
  end
  redis.call('ZREM', key, acq)
  st.sum[i] = st.sum[i] - w
  save_limit(st, i)
  return true
end

-- ready_at is the Redis time from which w fits, as far as the grants made
-- so far tell: now when it fits; else, for each limit it does not fit, the
-- end of the window of the grant whose leaving frees enough units.
local function ready_at(st, w, now)
  local t = now
  for i = 1, st.L do
    local need = used(st, i) + w[i] - st.n[i]
    if w[i] > 0 and need > 0 then
      local e = redis.call('ZRANGEBYSCORE', log_key(i), fmt_int(st.back[i] + need), '+inf', 'LIMIT', 0, 1)
      local g = e[1] and grant_of(e[1], st.L)
      if g then
        t = math.max(t, g + st.per[i])
      else
        t = math.max(t, now + st.per[i])
      end
    end
  end
  return t
end

-- wait_for is how long from now until a start of w may be possible: 0
-- while it fits and nobody queues; with waiters queued, not before the
-- queue's head fits either (then it is a lower bound).
local function wait_for(st, w, now)
  local t = ready_at(st, w, now)
  local head = redis.call('LINDEX', KEYS[3], 0)
  if head then
    local hw = request_of(head, st.L)
    if hw then t = math.max(t, ready_at(st, hw, now)) end
    t = math.max(t, now + 1)
  end
  return t - now
end

-- sweep forgets waiters whose liveness deadline passed (their client died
-- or was cut off) and expired tombstones.
local function sweep(st, now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 100)
  for _, m in ipairs(dead) do
    redis.call('ZREM', KEYS[4], m)
    if string.sub(m, 1, 2) == 'w:' then
      local acq = string.sub(m, 3)
      redis.call('LREM', KEYS[3], 0, acq)
      redis.call('HDEL', KEYS[2], 'r:' .. acq)
      redis.call('DEL', inbox_of(acq))
      if redis.call('HGET', KEYS[1], 'timer') == acq then
        redis.call('HDEL', KEYS[1], 'timer')
      end
      forget(st, acq)
    end
  end
end

-- ring wakes acq's BLPOP. The inbox of another waiter may not have been
-- type-checked: one of the wrong type is left alone (that waiter wakes at
-- its next timeout anyway).
local function ring(acq)
  redis.pcall('RPUSH', inbox_of(acq), 1)
end

-- serve grants queued waiters, oldest first, while the head's request
-- fits, ringing each one's doorbell: a large request at the head is not
-- overtaken by smaller ones behind it. A head the rate in force can never
-- admit (lowered by rate_set.lua), or without a readable request, leaves
-- the queue and is rung: its script then starts over and reports. Then the
-- new head learns that it keeps time (wakes when its request fits) by being
-- rung too.
local function serve(st, now)
  for _ = 1, 1000 do
    local head = redis.call('LINDEX', KEYS[3], 0)
    if not head then break end
    local w = request_of(head, st.L)
    if w and not too_large(st, w) then
      if not fits(st, w) then break end
      grant(st, head, w, now)
    end
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[2], 'r:' .. head)
    ring(head)
  end
  local head = redis.call('LINDEX', KEYS[3], 0)
  if head and redis.call('HGET', KEYS[1], 'timer') ~= head then
    redis.call('HSET', KEYS[1], 'timer', head)
    ring(head)
  end
end

-- granted_reply is the reply for acq's grant, or nil when Redis records none.
local function granted_reply(st, acq, now)
  local g, w = grant_of(acq, st.L)
  if not g then return nil end
  return {GRANTED, g, wait_for(st, w, now), now}
end
