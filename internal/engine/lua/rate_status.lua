-- rate_status.lua: a consistent, read-only snapshot of a gate.
-- KEYS: meta, holders, queue, waits, log1, log2, log3, log4 (see rate_common.lua)
-- ARGV: none
-- Returns {nowUs, metaFlat, waiting, limit1, ..., limitL}, where waiting
-- counts the waiters registered right now and limit i is {used, due, stray}:
-- the units in its window, of those the units whose window has passed but
-- that no script has let go yet, and the log entries without a grant record
-- among those looked at (up to 1000 from the oldest).

local err = check_rate_types(meta_key, holders_key, queue_key, waits_key, log1_key, log2_key, log3_key, log4_key)
if err then return redis.error_reply(err) end
local now = now_us()
local meta = redis.call('HGETALL', meta_key)
local waiting = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', waits_key, fmt_int(now), '+inf')) do
  if string.sub(m, 1, 2) == 'w:' then waiting = waiting + 1 end
end
local out = {now, meta, waiting}
local st = nil
if not redis.call('HGET', meta_key, 'epoch') then st = rate_state() end
if st then
  for i = 1, st.L do
    local due, stray, prev = 0, 0, st.back[i]
    local entries = redis.call('ZRANGE', log_key(i), 0, 999, 'WITHSCORES')
    for j = 1, #entries, 2 do
      local g = grant_of(entries[j], st.L)
      if g and g + st.per[i] > now then break end
      local s = math.min(tonumber(entries[j + 1]) or prev, st.sum[i])
      if not g then stray = stray + 1 end
      due = due + math.max(s - prev, 0)
      prev = math.max(prev, s)
    end
    out[#out + 1] = {used(st, i), due, stray}
  end
end
return out
