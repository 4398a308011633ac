-- rate_common.lua: the rate gate's record (after base.lua).
--
-- A gate has one to MAX_LIMITS limits ("at most n units in any window of
-- per"); a start takes w[i] units of limit i, all or none. Keys (one hash
-- tag; base = <prefix>{<name>}:rate:), with s(1) = '' and s(i) = ':'..i:
--   meta_key            hash  limits (1 when absent); size..s(i) (n),
--                             per..s(i) (µs), sum..s(i) (units granted so
--                             far), back..s(i) (of those, how many left the
--                             window); fence (last grant time, µs), set (1
--                             once rate_set.lua wrote the rate), changed,
--                             rejected, created, timer (the head keeping time)
--   holders_key         hash  "g:"..acqID -> "grantUs w1 .. wL" while in a
--                             window or not yet collected; "r:"..acqID ->
--                             "w1 .. wL", what a queued waiter asks for
--   queue_key           list  acqIDs of blocked waiters, oldest first
--   waits_key           zset  "w:"..acqID -> liveness deadline (µs),
--                             "x:"..acqID -> tombstone deadline
--   log<i>_key          zset  acqID -> sum..s(i) right after its grant, for
--                             the grants in limit i's window
--   inbox_key           list  base.."in:"..acqID, a waiter's doorbell
-- Units in limit i's window: sum - back. A grant leaves the window when
-- Redis TIME reaches its time plus per, and back becomes its logged sum;
-- as log scores are running sums, one ZRANGEBYSCORE finds the grant whose
-- leaving frees k units (ready_at). Grant times strictly increase.
-- After a change to a longer per, a made-up grant FORGOTTEN..i at the head
-- of log i stands for the grants the gate forgot (rate_set.lua); back may
-- then be below 0.

local MAX_LIMITS = 4
local MAX_UNITS = 1000000000
-- Log scores are exact up to 2^53: a sum past REBASE moves the log down (grant).
local REBASE = 2 ^ 50
-- The acqID of limit i's made-up grant is FORGOTTEN..i; a client's is hex.
local FORGOTTEN = 'forgotten:'

local function sfx(i)
  if i == 1 then return '' end
  return ':' .. i
end

local log_keys = {log1_key, log2_key, log3_key, log4_key}
local function log_key(i)
  return log_keys[i]
end

-- check_rate_types checks the keys given, in the order of the layout above.
local function check_rate_types(...)
  local want = {'hash', 'hash', 'list', 'zset', 'zset', 'zset', 'zset', 'zset', 'list'}
  for i, key in ipairs({...}) do
    local e = type_err(key, want[i])
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

-- rate_err is the mismatch reply: the stored limits.
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
  local rec = redis.call('HGET', holders_key, 'g:' .. acq)
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
  local rec = redis.call('HGET', holders_key, 'r:' .. acq)
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
  redis.call('HSET', meta_key, 'sum' .. sfx(i), fmt_int(st.sum[i]), 'back' .. sfx(i), fmt_int(st.back[i]))
end

-- create writes meta for rate r at Redis time now; grants or a log without
-- meta are corruption.
local function create(r, now, set)
  local n = redis.call('EXISTS', holders_key)
  for i = 1, MAX_LIMITS do n = n + redis.call('EXISTS', log_key(i)) end
  if n > 0 then
    return nil, 'REDSEM_CORRUPT ' .. meta_key .. ' is missing but grants exist'
  end
  -- Tombstones left while the gate did not exist expire (rate_abort.lua);
  -- from here on waits follows the gate's expiry.
  redis.call('PERSIST', waits_key)
  local st = {L = r.L, n = {}, per = {}, sum = {}, back = {}, fence = now, set = set, idle = 0}
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
  redis.call('HSET', meta_key, unpack(f))
  return st, nil
end

-- upgrade turns a gate of redsem v0.1.0 ("epoch" in meta, start tokens and
-- leases, which share the hash tag) into this layout, counting the old
-- window as full: n units granted at the last grant time. A v0.1.0 client
-- then fails with REDSEM_CORRUPT instead of sharing the gate.
local function upgrade(m)
  local n, per, fence = tonumber(m[5]), tonumber(m[6]), tonumber(m[2])
  if not n or n < 1 or not per or per < 1 or not fence then
    return 'REDSEM_CORRUPT ' .. meta_key .. ' is not a redsem rate gate record'
  end
  redis.call('DEL', base() .. 'tokens', base() .. 'leases', holders_key)
  redis.call('HDEL', meta_key, 'epoch', 'timer')
  redis.call('HSET', meta_key, 'limits', 1, 'sum', fmt_int(n), 'back', 0)
  redis.call('ZADD', log_key(1), fmt_int(n), 'upgrade')
  redis.call('HSET', holders_key, 'g:upgrade', fmt_int(fence) .. ' ' .. fmt_int(n))
  return nil
end

-- rate_state reads meta into {L, n, per, sum, back, fence, set, idle, exp,
-- fence_read (the fence as read)}: nil when the gate does not exist; nil,
-- err when meta is unusable.
local function rate_state()
  local m = redis.call('HMGET', meta_key, 'limits', 'fence', 'set', 'epoch', 'size', 'per', 'idle', 'exp')
  if not m[1] and not m[2] and not m[4] and not m[5] then return nil, nil end
  if m[4] then
    local e = upgrade(m)
    if e then return nil, e end
    m[1] = '1'
  end
  local L, fence = int_arg(m[1] or '1', 1, MAX_LIMITS), tonumber(m[2])
  if not L or not fence then
    return nil, 'REDSEM_CORRUPT ' .. meta_key .. ' is not a redsem rate gate record'
  end
  if fence >= FENCE_MAX then
    return nil, 'REDSEM_CORRUPT ' .. meta_key .. ' holds grant time ' .. m[2] .. ', too large to grow'
  end
  local st = {L = L, n = {}, per = {}, sum = {}, back = {}, fence = fence, set = m[3] == '1',
    idle = tonumber(m[7]) or 0, exp = m[8], fence_read = fence}
  local f = {}
  for i = 1, L do
    for _, name in ipairs({'size', 'per', 'sum', 'back'}) do f[#f + 1] = name .. sfx(i) end
  end
  local v = redis.call('HMGET', meta_key, unpack(f))
  for i = 1, L do
    local j = (i - 1) * 4
    st.n[i], st.per[i] = tonumber(v[j + 1]), tonumber(v[j + 2])
    st.sum[i], st.back[i] = tonumber(v[j + 3]), tonumber(v[j + 4])
    if not st.n[i] or st.n[i] < 1 or not st.per[i] or st.per[i] < 1 or not st.sum[i]
      or not st.back[i] or st.back[i] > st.sum[i] then
      return nil, 'REDSEM_CORRUPT ' .. meta_key .. ' is not a redsem rate gate record'
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
