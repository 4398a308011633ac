-- election_common.lua: helpers of the election scripts (after base.lua).
--
-- An election is a mutex (a semaphore of size 1 whose keys start with
-- base = <prefix>{<name>}:el:) and, beside its keys in the same slot:
--   meta_key           the mutex's meta hash (only its slot is used here)
--   leases_key         the mutex's zset: token -> lease deadline (ms)
--   holders_key        the mutex's hash: a:<acqID> -> token,
--                      t:<token> -> acqID|fence|grantedMs|label
--   leader_key         hash: epoch (Redis TIME, µs, when it was made), seq
--                      (the last change's), term (0: no leader), value, and
--                      acq (the leader's acquisition) while there is one
--   log_key            list: the last LOG_MAX changes, "seq|term|value"
--   observers_key      zset: observer id -> its registration's end (ms)
--   bell_key           list: base.."ob:"..id, an observer's doorbell
-- The mutex's holder leads once a claim announced it, and leads while its
-- lease is current (recorded and not expired). Every script that finds the
-- announced leader no longer current announces "no leader" first, so each
-- change is logged once, in order, and every registered observer's doorbell
-- rings.

local LOG_MAX = 100

local function check_el_types(...)
  local want = {'hash', 'zset', 'hash', 'hash', 'list', 'zset', 'list'}
  for i, key in ipairs({...}) do
    local e = type_err(key, want[i])
    if e then return e end
  end
  return nil
end

-- lease_live returns the fence and deadline of acq's lease on the mutex
-- while Redis records it and it has not expired at now_ms; else nil.
local function lease_live(acq, now_ms)
  local tok = redis.call('HGET', holders_key, 'a:' .. acq)
  if not tok then return nil end
  local rec = redis.call('HGET', holders_key, 't:' .. tok)
  local dl = tonumber(redis.call('ZSCORE', leases_key, tok))
  if not rec or not dl or dl <= now_ms then return nil end
  local owner, fence = string.match(rec, '^([^|]*)|(%d+)|')
  if owner ~= acq then return nil end
  return tonumber(fence), dl
end

-- el_state reads the leader hash: nil when there is none, nil and an error
-- when it is not an election's.
local function el_state()
  local m = redis.call('HMGET', leader_key, 'epoch', 'seq', 'term', 'value', 'acq')
  if not m[1] and not m[2] then return nil, nil end
  local seq, term = tonumber(m[2]), tonumber(m[3])
  if not m[1] or not seq or not term then
    return nil, 'REDSEM_CORRUPT ' .. leader_key .. ' is not a redsem election record'
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
  local dead = redis.call('ZRANGEBYSCORE', observers_key, '-inf', '(' .. now_ms, 'LIMIT', 0, 1000)
  if #dead > 0 then redis.call('ZREM', observers_key, unpack(dead)) end
  local obs = redis.call('ZRANGE', observers_key, 0, -1, 'WITHSCORES')
  for i = 1, #obs, 2 do ring_one(obs[i], tonumber(obs[i + 1]), now_ms) end
end

-- announce records the change to term and value (acq nil and term 0: no
-- leader), logs it and rings every observer; it returns the new state.
local function announce(st, acq, term, value, now)
  if not st then st = {epoch = fmt_int(now), seq = 0} end
  st.seq, st.term, st.value, st.acq = st.seq + 1, term, value, acq
  redis.call('HSET', leader_key, 'epoch', st.epoch, 'seq', fmt_int(st.seq), 'term', fmt_int(term), 'value', value)
  if acq then
    redis.call('HSET', leader_key, 'acq', acq)
  else
    redis.call('HDEL', leader_key, 'acq')
  end
  redis.call('RPUSH', log_key, fmt_int(st.seq) .. '|' .. fmt_int(term) .. '|' .. value)
  if redis.call('LLEN', log_key) > LOG_MAX then redis.call('LPOP', log_key) end
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
