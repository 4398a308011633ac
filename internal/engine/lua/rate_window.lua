-- rate_window.lua: the rate gate's windows and queue (after rate_common.lua).

-- forget drops acq's grant record once no log holds it and no waiter is
-- still to collect it.
local function forget(st, acq)
  for i = 1, st.L do
    if redis.call('ZSCORE', log_key(i), acq) then return end
  end
  if redis.call('ZSCORE', waits_key, 'w:' .. acq) then return end
  redis.call('HDEL', holders_key, 'g:' .. acq)
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
      if not g then redis.call('HINCRBY', meta_key, 'rejected', 1) end
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
  redis.call('HSET', meta_key, 'fence', fmt_int(g))
  redis.call('HSET', holders_key, 'g:' .. acq, table.concat(rec, ' '))
  return g
end

-- refund takes acq's w units of limit i out of the window (a start the
-- client never learnt of), moving later running sums down by w; with more
-- than 1000 later grants, the units come back when the window ends instead.
-- So do those of a grant made before the last change while a made-up
-- grant is at the front of the log: it was sized with them (rate_set.lua),
-- and taking them out would let in what it stands for.
-- g is the grant's time. Reports whether limit i holds none of acq.
local function refund(st, i, acq, w, g)
  local key = log_key(i)
  local s = redis.call('ZSCORE', key, acq)
  if not s then return true end
  if redis.call('ZRANGE', key, 0, 0)[1] == FORGOTTEN .. i then
    local changed = tonumber(redis.call('HGET', meta_key, 'changed'))
    if not g or not changed or g < changed then return false end
  end
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

-- wait_for is how long until a start of w may be possible: 0 while it fits
-- and nobody queues; else not before the queue's head fits either.
local function wait_for(st, w, now)
  local t = ready_at(st, w, now)
  local head = redis.call('LINDEX', queue_key, 0)
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
  local dead = redis.call('ZRANGEBYSCORE', waits_key, '-inf', now, 'LIMIT', 0, 100)
  for _, m in ipairs(dead) do
    redis.call('ZREM', waits_key, m)
    if string.sub(m, 1, 2) == 'w:' then
      local acq = string.sub(m, 3)
      redis.call('LREM', queue_key, 0, acq)
      redis.call('HDEL', holders_key, 'r:' .. acq)
      redis.call('DEL', inbox_of(acq))
      if redis.call('HGET', meta_key, 'timer') == acq then
        redis.call('HDEL', meta_key, 'timer')
      end
      forget(st, acq)
    end
  end
end

-- ring wakes acq's BLPOP; an inbox of the wrong type is left alone. The
-- doorbells rung are in rung (settle_idle gives them the gate's expiry).
local rung = {}
local function ring(acq)
  redis.pcall('RPUSH', inbox_of(acq), 1)
  rung[#rung + 1] = acq
end

-- serve grants queued waiters, oldest first, while the head's request fits
-- (no small request overtakes a large one), ringing each. A head that the
-- rate can never admit, or without a readable request, leaves the queue and
-- is rung too; so is a new head, which keeps time from then on.
local function serve(st, now)
  for _ = 1, 1000 do
    local head = redis.call('LINDEX', queue_key, 0)
    if not head then break end
    local w = request_of(head, st.L)
    if w and not too_large(st, w) then
      if not fits(st, w) then break end
      grant(st, head, w, now)
    end
    redis.call('LPOP', queue_key)
    redis.call('HDEL', holders_key, 'r:' .. head)
    ring(head)
  end
  local head = redis.call('LINDEX', queue_key, 0)
  if head and redis.call('HGET', meta_key, 'timer') ~= head then
    redis.call('HSET', meta_key, 'timer', head)
    ring(head)
  end
end

-- granted_reply is the reply for acq's grant, or nil when Redis records none.
local function granted_reply(st, acq, now)
  local g, w = grant_of(acq, st.L)
  if not g then return nil end
  return {GRANTED, g, wait_for(st, w, now), now}
end
