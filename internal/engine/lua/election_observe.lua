-- election_observe.lua: Observe and Leader of an election. Runs alone or
-- right behind an observer's
--   BLPOP <bell> <timeout>
-- in the same write: the scripts that change the leader ring the bell.
--
-- KEYS: meta, leases, holders, leader, log, observers, bell (all: see election_common.lua)
-- ARGV: obsID, epoch (the one the observer saw last; "" if none), afterSeq
--       (the last change it saw; -1: none yet), blockMs (how long it may
--       wait next; 0: read once, and take obsID's registration back),
--       graceMs (how long past its block a registration lasts)
-- Returns {blockMs, nowUs, epoch, seq, then term, value of each change
-- after afterSeq, oldest first}: every change when the log still holds all
-- of them since (epoch, afterSeq), else only the current state. The block
-- ends by the leader's lease deadline, so that an observer finds a crashed
-- leader gone within one TTL.
-- Errors: REDSEM_ARG, REDSEM_WRONGTYPE, REDSEM_CORRUPT.

local obs, epoch, after = ARGV[1], ARGV[2], tonumber(ARGV[3])
local block, grace = int_arg(ARGV[4], 0, 1e9), int_arg(ARGV[5], 0, 1e9)
if #obs < 16 or not after or not block or not grace then
  return redis.error_reply('REDSEM_ARG invalid arguments to election_observe')
end
local err = check_el_types(meta_key, leases_key, holders_key, leader_key, log_key, observers_key, bell_key)
if err then return redis.error_reply(err) end
redis.call('DEL', bell_key)
local now = now_us()
local now_ms = math.floor(now / 1000)
local st
st, err = el_state()
if err then return redis.error_reply(err) end
st = sync(st, now)

local out = {0, now, '', 0}
if st then
  out[3], out[4] = st.epoch, fmt_int(st.seq)
  local log = redis.call('LRANGE', log_key, 0, -1)
  local first = st.seq - #log + 1
  if (epoch == st.epoch and after >= first - 1) or (epoch == '' and after == 0 and first == 1) then
    for _, e in ipairs(log) do
      local seq, term, value = string.match(e, '^(%d+)|(%d+)|(.*)$')
      if tonumber(seq) > after then
        out[#out + 1] = term
        out[#out + 1] = value
      end
    end
  else
    out[#out + 1] = fmt_int(st.term)
    out[#out + 1] = st.value
  end
else
  out[5], out[6] = '0', ''
end

if block == 0 then
  redis.call('ZREM', observers_key, obs)
  return out
end
if st and st.acq then
  local _, dl = lease_live(st.acq, now_ms)
  block = math.min(block, dl - now_ms + 1)
end
block = math.max(block, 1)
out[1] = block
redis.call('ZADD', observers_key, now_ms + block + grace, obs)
return out
