-- election_common.lua: helpers of the election scripts (after base.lua).
--
-- An election is a mutex (a semaphore of size 1 whose keys start with
-- base = <prefix>{<name>}:el:) and, beside its keys in the same slot:
--   KEYS[1] meta       the mutex's meta hash (only its slot is used here)
--   KEYS[2] leases     the mutex's zset: token -> lease deadline (ms)
--   KEYS[3] holders    the mutex's hash: a:<acqID> -> token,
--                      t:<token> -> acqID|fence|grantedMs|label
--   KEYS[4] leader     hash: epoch (Redis TIME, µs, when it was made), seq
--                      (the last change's), term (0: no leader), value, and
--                      acq (the leader's acquisition) while there is one
--   KEYS[5] log        list: the last LOG_MAX changes, "seq|term|value"
--   KEYS[6] observers  zset: observer id -> its registration's end (ms)
--   KEYS[7] bell       list: base.."ob:"..id, an observer's doorbell
-- The mutex's holder leads once a claim announced it, and leads while its
-- lease is current (recorded and not expired). Every script that finds the
-- announced leader no longer current announces "no leader" first, so each
-- change is logged once, in order, and every registered observer's doorbell
-- rings.

local LOG_MAX = 100

local function check_el_types(n)
  local want = {'hash', 'zset', 'hash', 'hash', 'list', 'zset', 'list'}
  for i = 1, n do
    local e = type_err(KEYS[i], want[i])
    if e then return e end
  end
  return nil
end

-- lease_live returns the fence and deadline of acq's lease on the mutex
-- while Redis records it and it has not expired at now_ms; else nil.
local function lease_live(acq, now_ms)
  local tok = redis.call('HGET', KEYS[3], 'a:' .. acq)
  if not tok then return nil end
  local rec = redis.call('HGET', KEYS[3], 't:' .. tok)
  local dl = tonumber(redis.call('ZSCORE', KEYS[2], tok))
  if not rec or not dl or dl <= now_ms then return nil end
  local owner, fence = string.match(rec, '^([^|]*)|(%d+)|')
  if owner ~= acq then return nil end
  return tonumber(fence), dl
end

-- el_state reads the leader hash: nil when there is none, nil and an error
-- when it is not an election's.
local function el_state()
  local m = redis.call('HMGET', KEYS[4], 'epoch', 'seq', 'term', 'value', 'acq')
  if not m[1] and not m[2] then return nil, nil end
  local seq, term = tonumber(m[2]), tonumber(m[3])
  if not m[1] or not seq or not term then
    return nil, 'REDSEM_CORRUPT ' .. KEYS[4] .. ' is not a redsem election record'
  end
  local acq = m[5]
  if acq == false then acq = nil end
  return {epoch = m[1], seq = seq, term = term, value = m[4] or '', acq = acq}, nil
end

-- ring_one pushes onto the doorbell of observer id, registered until
-- until_ms; the bell outlives the registration by a second.
local function ring_one(id, until_ms, now_ms)
  local bell = base() .. 'ob:' .. id
  redis.call('LPUSH', bell, 1)
  redis.call('PEXPIRE', bell, math.max(until_ms - now_ms, 0) + 1000)
end

-- ring rings every observer still registered (and forgets lapsed ones).
local function ring(now_ms)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. now_ms, 'LIMIT', 0, 1000)
  if #dead > 0 then redis.call('ZREM', KEYS[6], unpack(dead)) end
  local obs = redis.call('ZRANGE', KEYS[6], 0, -1, 'WITHSCORES')
  for i = 1, #obs, 2 do ring_one(obs[i], tonumber(obs[i + 1]), now_ms) end
end

-- announce records the change to term and value (acq nil and term 0: no
-- leader), logs it and rings every observer; it returns the new state.
local function announce(st, acq, term, value, now)
  if not st then st = {epoch = fmt_int(now), seq = 0} end
  st.seq, st.term, st.value, st.acq = st.seq + 1, term, value, acq
  redis.call('HSET', KEYS[4], 'epoch', st.epoch, 'seq', fmt_int(st.seq), 'term', fmt_int(term), 'value', value)
  if acq then
    redis.call('HSET', KEYS[4], 'acq', acq)
  else
    redis.call('HDEL', KEYS[4], 'acq')
  end
  redis.call('RPUSH', KEYS[5], fmt_int(st.seq) .. '|' .. fmt_int(term) .. '|' .. value)
  if redis.call('LLEN', KEYS[5]) > LOG_MAX then redis.call('LPOP', KEYS[5]) end
  ring(math.floor(now / 1000))
  return st
end

-- sync announces "no leader" when the announced leader's lease is no longer
-- current (released, expired, reclaimed, or lost with the data).
local function sync(st, now)
  if st and st.acq and not lease_live(st.acq, math.floor(now / 1000)) then
    return announce(st, nil, 0, '', now)
  end
  return st
end
