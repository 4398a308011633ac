-- abort_n.lua: settle a weighted acquisition whose reply the client could
-- not read, or that the client gave up (cancelled context).
-- KEYS: meta, tokens, leases, holders, waits, pend, bell, queue (weighted.lua)
-- ARGV: acqID, k, mode ("release" or "resolve"), tombMs
-- If the acquisition was granted and still holds all k leases, mode
-- "resolve" keeps them and returns {1, fence, deadlineMs, nowUs, "token ..."} as
-- acquire_n.lua does. Otherwise every token it holds (granted, or collected
-- so far: its part list, sealed or not) and any token in its pending list
-- goes back at once, it leaves the ticket queue or hands the ticket on, and
-- it returns {3, 0, nowUs} when a granted lease was given back, else
-- {0, 0, nowUs}; an acquisition never granted also gets a tombstone (as in
-- abort.lua), so a late script or a BLMOVE of it still registered can never
-- collect or lease again.

local acq, k, mode, tomb = ARGV[1], int_arg(ARGV[2], 1, 100000), ARGV[3], int_arg(ARGV[4], 0, 1e9)
if #acq < 16 or string.find(acq, '[|:]') or not k or not tomb
  or (mode ~= 'release' and mode ~= 'resolve') then
  return redis.error_reply('REDSEM_ARG invalid arguments to abort_n')
end
local err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key) or type_err(pend_key, 'list') or type_err(bell_key, 'list')
  or type_err(queue_key, 'list') or type_err(part_of(acq), 'list')
if err then return redis.error_reply(err) end
local now = now_us()
local now_ms = math.floor(now / 1000)
local size, epoch, _, due
size, epoch, _, due, err = read_meta()
if err then return redis.error_reply(err) end

-- A granted lease is listed in "a:"..acq; what is still being collected or
-- sealed is in the part list only.
local toks = held_by(acq)
local granted, fence = false, 0
if #toks > 0 then
  fence = tonumber(string.match(redis.call('HGET', holders_key, 't:' .. toks[1]), '^[^|]*|([^|]*)|')) or 0
  granted = fence > 0
end
if granted and mode == 'resolve' and #toks == k then
  local score = tonumber(redis.call('ZSCORE', leases_key, toks[1]))
  if score > now_ms then
    return {GRANTED, fence, score, now, table.concat(toks, ' ')}
  end
end

-- Freeing writes first, then the pushes.
unlease(acq, toks)
local pend = redis.call('LRANGE', pend_key, 0, 9)
redis.call('DEL', pend_key, bell_key)
redis.call('ZREM', waits_key, 'w:' .. acq)
redis.call('LREM', queue_key, 0, acq .. '|' .. k)
local coll = parse_coll(redis.call('HGET', meta_key, 'coll'))
if coll and coll.acq == acq then pass_ticket(now_ms, acq) end
if not granted then
  redis.call('ZADD', waits_key, now_ms + tomb, 'x:' .. acq)
  -- due may not fall after the tombstone (see abort.lua).
  if due and now_ms + tomb < due then redis.call('HSET', meta_key, 'due', now_ms + tomb) end
  redis.call('HSET', size and meta_key or holders_key, 'x:' .. acq, now_ms + tomb) -- see abort.lua
end
drop_partial(acq, epoch, size)
for _, tok in ipairs(toks) do give_back(tok, epoch, size, true) end
for _, tok in ipairs(pend) do give_back(tok, epoch, size) end
settle_idle(now_ms)
if granted then return {RELEASED, 0, now} end
return {WAITING, 0, now}
