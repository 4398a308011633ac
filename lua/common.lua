-- common.lua: shared prologue, prepended by scripts.go to every script except
-- status.lua. It defines helpers only; nothing here writes.
--
-- Key layout (all keys share one hash tag, so one cluster slot):
--   KEYS[1] meta     hash  size, epoch, fence, due, rejected, created
--   KEYS[2] tokens   list  free tokens; BLMOVE and LPOP take from the left
--   KEYS[3] leases   zset  token -> lease deadline, ms of Redis TIME
--   KEYS[4] holders  hash  "t:"..token -> "acqID|fence|grantedMs|label",
--                          "a:"..acqID -> token,
--                          "x:"..acqID -> tombstone expiry (see waits)
--   KEYS[5] waits    zset  "w:"..acqID -> when its pending list may be swept,
--                          "x:"..acqID -> when the tombstone of an aborted
--                          acquisition (also in holders) may go
-- A waiter's pending list is base.."pend:"..acqID, where base is KEYS[1]
-- without its "meta" suffix: it shares the tag, so it lives in the same slot.
--
-- Every script reads and validates before its first write (a script that
-- fails half way is not rolled back), and every loop is bounded.

-- On Redis Cluster, a script that runs on the source node of a slot being
-- migrated fails at its first access to a key that does not exist there
-- ("Script attempted to access a non local key"), even a key it emptied
-- itself a moment before, and keeps the writes it made before (no rollback):
-- a token popped or a lease removed would be lost. So probe with a key that
-- never exists and step aside before any write; TRYAGAIN makes a cluster
-- client retry once the migration is over. Anywhere else the probe is one
-- EXISTS that returns 0.
do
  local probe = redis.pcall('EXISTS', string.sub(KEYS[1], 1, #KEYS[1] - 4) .. 'probe')
  if type(probe) == 'table' and probe['err'] then
    return redis.error_reply('TRYAGAIN redsem: slot is migrating')
  end
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- int_arg returns s as a whole number within [lo, hi], or nil (rejecting
-- "nan", "inf", fractions and anything out of range).
local function int_arg(s, lo, hi)
  local n = tonumber(s)
  if not n or n ~= n or n < lo or n > hi or n ~= math.floor(n) then return nil end
  return n
end

local function fmt_int(n)
  return string.format('%.0f', n)
end

-- type_err returns an error string when key exists with a type other than want.
local function type_err(key, want)
  local t = redis.call('TYPE', key)
  if type(t) == 'table' then t = t['ok'] end
  if t ~= 'none' and t ~= want then
    return 'REDSEM_WRONGTYPE ' .. key .. ' holds a ' .. t .. ', want a ' .. want
  end
  return nil
end

local function check_types(n)
  local want = {'hash', 'list', 'zset', 'hash', 'zset'}
  for i = 1, n do
    local e = type_err(KEYS[i], want[i])
    if e then return e end
  end
  return nil
end

-- read_meta returns size, epoch, fence, due, nil (no error), coll, over and
-- held (all nil when the semaphore does not exist), or nil, nil, nil, nil,
-- err when meta is unusable. due is a lower bound of every score in leases and waits: nothing
-- can be expired or stale before it, so the sweeps are skipped until then
-- (0 when unknown). coll is the collector ticket of a weighted acquisition
-- (weighted.lua); over and held are those of a shrink (see returned).
local function read_meta()
  local m = redis.call('HMGET', KEYS[1], 'size', 'epoch', 'fence', 'due', 'coll', 'over', 'held')
  if not m[1] and not m[2] then return nil, nil, nil, nil, nil end
  local size = tonumber(m[1])
  local fence = tonumber(m[3])
  if not size or size < 1 or not m[2] or not fence then
    return nil, nil, nil, nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' is not a redsem meta record'
  end
  return size, m[2], fence, tonumber(m[4]) or 0, nil, m[5], tonumber(m[6]) or 0, m[7]
end

-- NO_DUE stands for "no lease and no waiter": later than any real score.
local NO_DUE = 9e15

-- create makes the semaphore with size tokens of a new epoch (the first 12
-- hex digits of seed, a random id) at server time now (µs), and returns the
-- epoch, or nil and an error string. HSETNX is the guard against a second
-- creator, and the script is atomic: no client ever sees a half-filled list.
-- Tokens or leases without meta are residue that create refuses (holders
-- may hold tombstones of acquisitions aborted before creation: fine).
local function create(size, seed, now)
  if redis.call('EXISTS', KEYS[2]) + redis.call('EXISTS', KEYS[3]) > 0 then
    return nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' is missing but tokens or leases exist'
  end
  local epoch = string.sub(seed, 1, 12)
  redis.call('HSETNX', KEYS[1], 'size', size)
  redis.call('HSET', KEYS[1], 'epoch', epoch, 'fence', fmt_int(now), 'due', fmt_int(NO_DUE),
    'rejected', 0, 'created', math.floor(now / 1000))
  local batch = {}
  for i = 1, size do
    batch[#batch + 1] = epoch .. ':' .. i
    if #batch == 1000 or i == size then
      redis.call('RPUSH', KEYS[2], unpack(batch))
      batch = {}
    end
  end
  return epoch, nil
end

-- next_due is the earliest score in leases and waits, or NO_DUE.
local function next_due()
  local d = NO_DUE
  for _, key in ipairs({KEYS[3], KEYS[5]}) do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] then d = math.min(d, tonumber(first[2])) end
  end
  return d
end

-- is_valid reports whether tok is a token of this generation of the semaphore:
-- "<epoch>:<slot>" with 1 <= slot <= size, written canonically.
local function is_valid(tok, epoch, size)
  local e, s = string.match(tok, '^([^:]+):([1-9][0-9]*)$')
  if e ~= epoch then return false end
  local n = tonumber(s)
  return n ~= nil and n <= size
end

local function owner_of(rec)
  return string.match(rec, '^([^|]*)|')
end

-- base is the common prefix of this semaphore's keys, e.g. "redsem:{name}:".
local function base()
  return string.sub(KEYS[1], 1, #KEYS[1] - 4)
end

-- is_retired reports whether tok is a token of this epoch above the size:
-- retired by a shrink.
local function is_retired(tok, epoch, size)
  local e, s = string.match(tok, '^([^:]+):([1-9][0-9]*)$')
  return e ~= nil and e == epoch and tonumber(s) > size
end

-- save_shrink records a shrink's bookkeeping in meta: over, the leases on
-- retired tokens still out, and keep, the valid tokens withheld meanwhile
-- (see returned). Both go when over reaches 0.
local function save_shrink(over, keep)
  if over == 0 then
    redis.call('HDEL', KEYS[1], 'over', 'held')
  elseif #keep > 0 then
    redis.call('HSET', KEYS[1], 'over', over, 'held', table.concat(keep, ' '))
  else
    redis.call('HSET', KEYS[1], 'over', over)
    redis.call('HDEL', KEYS[1], 'held')
  end
end

-- returned puts valid tokens that came back onto the token list, and takes
-- note of retired_n leases on retired tokens that ended. After a shrink
-- (resize.lua) meta 'over' counts the leases on retired tokens still out,
-- and as many valid tokens as that are withheld (meta 'held', space
-- separated): so the holders drain down to the new size, and none is
-- granted above it meanwhile. With no shrink under way (no 'over'), it is a
-- plain LPUSH. over and held may be passed when the caller read meta; else
-- they are read here. Returns an error string if the list is not a list.
local function returned(valid, retired_n, over, held)
  if over == nil then
    local m = redis.call('HMGET', KEYS[1], 'over', 'held')
    over, held = tonumber(m[1]) or 0, m[2]
  end
  local push, keep, shrinking = valid, {}, over > 0 or held ~= nil
  if shrinking then
    over = math.max(over - retired_n, 0)
    for tok in string.gmatch(held or '', '%S+') do keep[#keep + 1] = tok end
    push = {}
    for _, tok in ipairs(valid) do
      if #keep < over then keep[#keep + 1] = tok else push[#push + 1] = tok end
    end
    while #keep > over do push[#push + 1] = table.remove(keep) end
  end
  for i = 1, #push, 1000 do
    local r = redis.pcall('LPUSH', KEYS[2], unpack(push, i, math.min(i + 999, #push)))
    if type(r) == 'table' and r['err'] then
      return 'REDSEM_WRONGTYPE ' .. KEYS[2] .. ' is not a list'
    end
  end
  if shrinking then save_shrink(over, keep) end
  return nil
end

-- give_back returns tok: onto the token list if it is valid and not leased
-- (through returned); leased says tok was a lease that just ended, so a
-- retired one settles a shrink's count. Anything else is dropped and counted
-- as rejected. Returns 1 when pushed or withheld.
local function give_back(tok, epoch, size, leased)
  if epoch and is_valid(tok, epoch, size) and not redis.call('ZSCORE', KEYS[3], tok) then
    returned({tok}, 0)
    return 1
  end
  if epoch and leased and is_retired(tok, epoch, size) then
    returned({}, 1)
    return 0
  end
  if epoch then redis.call('HINCRBY', KEYS[1], 'rejected', 1) end
  return 0
end

-- reclaim returns the tokens of leases that expired before now_ms, at most
-- limit of them, and the tokens stranded in pending lists whose waiter never
-- confirmed (see waits). The freeing writes (ZREM, HDEL, DEL) come before the
-- push, so reclaim still works when Redis is out of memory.
local function reclaim(now_ms, epoch, size, limit)
  local n = 0
  -- Both reads come before any write (see the header).
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms, 'LIMIT', 0, limit)
  local stale = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms, 'LIMIT', 0, limit)
  for _, tok in ipairs(expired) do
    redis.call('ZREM', KEYS[3], tok)
    local rec = redis.call('HGET', KEYS[4], 't:' .. tok)
    if rec then
      redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. (owner_of(rec) or ''))
    end
    n = n + give_back(tok, epoch, size, true)
  end
  for _, w in ipairs(stale) do
    if string.sub(w, 1, 2) == 'x:' then redis.call('HDEL', KEYS[4], w) end
    local pend = base() .. 'pend:' .. string.sub(w, 3)
    local toks = {}
    if not type_err(pend, 'list') then
      toks = redis.call('LRANGE', pend, 0, 9)
    end
    redis.call('DEL', pend)
    redis.call('ZREM', KEYS[5], w)
    for _, tok in ipairs(toks) do n = n + give_back(tok, epoch, size) end
  end
  return n
end
