-- sweep.lua: reclaiming expired leases and stale waiters (after tokens.lua).

-- A weighted collector (weighted.lua) lists the tokens it has so far in
-- its part list, each also a lease "acqID|0|ms|label" until the grant. Its
-- registration in waits lapses soon after it stops checking in, and the
-- sweep gives them back; PARTIAL_MS, their deadline, is only a backstop.
local PARTIAL_MS = 3600000

local function part_of(acq)
  return base() .. 'part:' .. acq
end

-- drop_partial gives back the tokens in acq's part list still leased to it
-- (anything else listed is left alone) and deletes the list, freeing writes
-- first. Returns how many went back onto the list (or were withheld).
local function drop_partial(acq, epoch, size)
  local part = part_of(acq)
  local toks = redis.call('LRANGE', part, 0, 99999)
  redis.call('DEL', part)
  local mine = owned_by(acq, toks)
  for i = 1, #mine, 1000 do
    local last = math.min(i + 999, #mine)
    local fields = {}
    for j = i, last do fields[#fields + 1] = 't:' .. mine[j] end
    redis.call('ZREM', leases_key, unpack(mine, i, last))
    redis.call('HDEL', holders_key, unpack(fields))
  end
  if not epoch then return 0 end
  local valid, retired, strays = {}, 0, 0
  for _, tok in ipairs(mine) do
    if is_valid(tok, epoch, size) then
      valid[#valid + 1] = tok
    elseif is_retired(tok, epoch, size) then
      retired = retired + 1
    else
      strays = strays + 1
    end
  end
  if #valid > 0 or retired > 0 then returned(valid, retired) end
  if strays > 0 then redis.call('HINCRBY', meta_key, 'rejected', strays) end
  return #valid
end

-- LATE_MS is how long a swept waiter's registration stays as a tombstone:
-- longer than a BLMOVE already written plausibly takes to arrive.
local LATE_MS = 60000

-- overdue reads what reclaim gives back at now_ms, at most limit of each:
-- expired leases and stale entries of waits. It only reads; a stale pending
-- list of the wrong type is an error (its token is not ours to guess). A
-- part list of another type is a stranger's, left alone.
local function overdue(now_ms, limit)
  local due_now = {
    now_ms = now_ms,
    expired = redis.call('ZRANGEBYSCORE', leases_key, '-inf', now_ms, 'LIMIT', 0, limit),
    stale = redis.call('ZRANGEBYSCORE', waits_key, '-inf', now_ms, 'LIMIT', 0, limit),
    parts = {},
  }
  for _, w in ipairs(due_now.stale) do
    local e = type_err(base() .. 'pend:' .. string.sub(w, 3), 'list')
    if e then return nil, e end
    local t = string.sub(w, 1, 2) == 'w:' and redis.call('TYPE', part_of(string.sub(w, 3)))
    if type(t) == 'table' then t = t['ok'] end
    if t == 'list' then due_now.parts[w] = true end
  end
  return due_now, nil
end

-- reclaim gives back the tokens of what overdue found, and returns how
-- many went back. Freeing writes come first, so it works at OOM.
local function reclaim(due_now, epoch, size)
  local n = 0
  for _, tok in ipairs(due_now.expired) do
    redis.call('ZREM', leases_key, tok)
    local rec = redis.call('HGET', holders_key, 't:' .. tok)
    if rec then redis.call('HDEL', holders_key, 't:' .. tok, 'a:' .. (owner_of(rec) or '')) end
    n = n + give_back(tok, epoch, size, true)
  end
  local late = {}
  for _, w in ipairs(due_now.stale) do
    if string.sub(w, 1, 2) == 'x:' then
      redis.call('HDEL', meta_key, w)
      redis.call('HDEL', holders_key, w)
    else
      late[#late + 1] = 'x:' .. string.sub(w, 3)
    end
    local pend = base() .. 'pend:' .. string.sub(w, 3)
    local toks = redis.call('LRANGE', pend, 0, 9)
    redis.call('DEL', pend)
    redis.call('ZREM', waits_key, w)
    for _, tok in ipairs(toks) do n = n + give_back(tok, epoch, size) end
    if due_now.parts[w] then n = n + drop_partial(string.sub(w, 3), epoch, size) end
  end
  -- A waiter that never confirmed may still have a BLMOVE on its way: its
  -- registration becomes a tombstone for LATE_MS, as abort.lua leaves one
  -- (written after the pushes: at maxmemory the tokens are back first).
  for _, x in ipairs(late) do
    redis.call('ZADD', waits_key, due_now.now_ms + LATE_MS, x)
    redis.call('HSET', epoch and meta_key or holders_key, x, fmt_int(due_now.now_ms + LATE_MS))
  end
  return n
end
