-- election.lua: Campaign's claim, Proclaim and Resign of an election.
--
-- KEYS: meta, leases, holders, leader, log, observers (see election_common.lua)
-- ARGV: op ("claim": announce acqID, the mutex's holder, as the leader with
--       value, or change its value; "resign": announce no leader if acqID
--       is the leader; "wake": ring the doorbell of observer acqID, if
--       registered, once the leader's lease deadline has passed), acqID,
--       value
-- Returns
--   {1, term, nowUs}  done (resign, wake: term 0)
--   {0, 0, nowUs}     claim: acqID's lease is not current; nothing announced
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_CORRUPT.

local op, acq, value = ARGV[1], ARGV[2], ARGV[3]
if (op ~= 'claim' and op ~= 'resign' and op ~= 'wake') or #acq < 16 or string.find(acq, '[|:]') then
  return redis.error_reply('REDSEM_ARG invalid arguments to election')
end
local err = check_el_types(meta_key, leases_key, holders_key, leader_key, log_key, observers_key)
if err then return redis.error_reply(err) end
local now = now_us()
if op == 'wake' then
  local reg = tonumber(redis.call('ZSCORE', observers_key, acq))
  if reg then ring_one(acq, reg, math.floor(now / 1000)) end
  return {1, 0, now}
end
local st
st, err = el_state()
if err then return redis.error_reply(err) end
st = sync(st, now)
if op == 'resign' then
  if st and st.acq == acq then announce(st, nil, 0, '', now) end
  return {1, 0, now}
end
local fence = lease_live(acq, math.floor(now / 1000))
if not fence then return not_here(leases_key) or {0, 0, now} end
if not (st and st.acq == acq and st.value == value) then
  announce(st, acq, fence, value, now)
end
return {1, fmt_int(fence), now}
