-- fast.lua: what the fast paths (acquire_fast.lua, release_fast.lua), which
-- run before the other helpers are defined, share with the rest of their
-- scripts.

-- fast_fail is the error reply for e, a pcall error on key.
local function fast_fail(e, key)
  if string.find(e['err'], 'WRONGTYPE', 1, true) then
    return redis.error_reply('REDSEM_WRONGTYPE ' .. key .. ' is of the wrong type')
  end
  return redis.error_reply('TRYAGAIN redsem: ' .. e['err'])
end

-- The grant, written once: acquire_fast.lua and acquire.lua's grant both
-- record a lease with record_lease and its fence with set_fence.

-- record_lease records tok's lease for acq until deadline (ms): the leases
-- entry (NX: never over a lease), then the record rec
-- ("acq|fence|grantMs|label") in holders, with holders' idle flag when
-- flag. Returns 1 recorded, 0 when tok is leased already, or a pcall error
-- and its key, with nothing written.
local function record_lease(tok, deadline, acq, rec, flag)
  local r = redis.pcall('ZADD', leases_key, 'NX', deadline, tok)
  if type(r) == 'table' then return r, leases_key end
  if r == 0 then return 0 end
  if flag then
    r = redis.pcall('HSET', holders_key, 't:' .. tok, rec, 'a:' .. acq, tok, 'idle', 1)
  else
    r = redis.pcall('HSET', holders_key, 't:' .. tok, rec, 'a:' .. acq, tok)
  end
  if type(r) == 'table' then
    redis.call('ZREM', leases_key, tok)
    return r, holders_key
  end
  return 1
end

-- set_fence writes fence (a digit string) to meta, and lowers due to
-- deadline when that is earlier (early for nothing only brings a sweep
-- forward).
local function set_fence(fence, deadline, due)
  if deadline < due then
    redis.call('HSET', meta_key, 'fence', fence, 'due', deadline)
  else
    redis.call('HSET', meta_key, 'fence', fence)
  end
end
