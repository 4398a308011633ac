-- meta.lua: the semaphore's record and its tokens (after base.lua).
--
-- Keys (one hash tag, so one cluster slot):
--   meta_key         hash  size, gen (the epoch), fence, due, rejected,
--                          created, idle
--                          and exp (idle.lua), "x:"..acqID -> tombstone
--                          expiry, a shrink's over, held, "h:"..i
--                          (tokens.lua), a weighted collector's coll and
--                          seal (weighted.lua)
--   tokens_key       list  free tokens "<epoch>:<slot>"; taken from the left
--   leases_key       zset  token -> lease deadline, ms of Redis TIME
--   holders_key      hash  "t:"..token -> "acqID|fence|grantedMs|label",
--                          "a:"..acqID -> its token(s), "x:"..acqID while
--                          the semaphore does not exist, "slow" while a
--                          shrink drains or a collector holds the ticket
--                          (release_fast.lua), "idle" (idle.lua)
--   waits_key        zset  "w:"..acqID -> when its pending list may be
--                          swept, "x:"..acqID -> when its tombstone goes
-- A waiter's pending list is base.."pend:"..acqID; a weighted collector's
-- part list base.."part:"..acqID. Every script reads and validates before
-- its first write, and every loop is bounded.

-- shrink_count reads a shrink's over or held as a whole number in
-- [0, 100000] (ten times engine.MaxSize, which the Go side enforces),
-- whatever a stranger wrote.
local function shrink_count(s)
  local n = tonumber(s)
  if not n or n ~= n or n < 0 then return 0 end
  return math.min(math.floor(n), 100000)
end

local function check_types(...)
  local want = {'hash', 'list', 'zset', 'hash', 'zset'}
  for i, key in ipairs({...}) do
    local e = type_err(key, want[i])
    if e then return e end
  end
  return nil
end

-- upgrade moves a semaphore of the first layout (its epoch in meta's epoch
-- field, as redsem wrote it before protocol v2) to this one once no client
-- of that layout uses it: no lease and no waiter's registration whose
-- deadline is still ahead. It renames epoch to gen, so that the clients of
-- the first layout refuse the name from then on (their scripts find no
-- epoch: REDSEM_CORRUPT) and grant nothing, and sets due to 0, so that the
-- acquisition that moved it sweeps what they left (lapsed leases, stranded
-- pending lists) before anything else. A name in use is refused with
-- REDSEM_LAYOUT, and so is one whose waits hold more than a thousand live
-- entries (tombstones: it is tried again once they lapse). Every key is
-- type-checked before the first write.
local function upgrade(epoch)
  local waits = base() .. 'waits'
  local err = check_types(meta_key, tokens_key, leases_key, base() .. 'holders', waits)
  if err then return err end
  local now_ms = math.floor(now_us() / 1000)
  local busy = #redis.call('ZRANGE', leases_key, now_ms, '+inf', 'BYSCORE', 'LIMIT', 0, 1) > 0
  local live = busy and {} or redis.call('ZRANGE', waits, now_ms, '+inf', 'BYSCORE', 'LIMIT', 0, 1000)
  busy = busy or #live == 1000
  for _, w in ipairs(live) do
    if string.sub(w, 1, 2) == 'w:' then busy = true end
  end
  if busy then
    return 'REDSEM_LAYOUT ' .. meta_key .. ' is in use by clients of redsem before protocol v2;'
      .. ' stop them (or wait until none holds or waits), and the next v2 acquisition moves the name to v2'
  end
  redis.call('HSET', meta_key, 'gen', epoch, 'due', 0)
  redis.call('HDEL', meta_key, 'epoch')
  return nil
end

-- read_meta returns size, epoch, fence, due, nil, coll, over and held (nil
-- when the semaphore does not exist), or nil, nil, nil, nil, err. due is a
-- lower bound of every score in leases and waits (0 when unknown): the
-- sweeps wait until then. The epoch is stored as gen; a semaphore of the
-- layout before protocol v2 (epoch instead) is read as it is with layout
-- 'read', moved to v2 (upgrade) with layout 'upgrade' by an acquisition
-- asking for its size (ask; nil takes any: REDSEM_SIZE for another), and
-- refused otherwise.
local function read_meta(layout, ask)
  local m = redis.call('HMGET', meta_key, 'size', 'gen', 'fence', 'due', 'coll', 'over', 'held', 'epoch')
  local msize, epoch, fence_s, due, coll, over, held, first = m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8]
  if not msize and not epoch and not first then return nil, nil, nil, nil, nil end
  local size, fence = tonumber(msize), tonumber(fence_s)
  if not size or size < 1 or size > 100000 or size % 1 ~= 0 or not (epoch or first) or not fence
    or (epoch and first) then
    return nil, nil, nil, nil, 'REDSEM_CORRUPT ' .. meta_key .. ' is not a redsem meta record'
  end
  if fence >= FENCE_MAX then
    return nil, nil, nil, nil, 'REDSEM_CORRUPT ' .. meta_key .. ' holds fence ' .. fence_s .. ', too large to grow'
  end
  if not epoch and layout == 'read' then
    epoch = first
  elseif not epoch and layout ~= 'upgrade' then
    return nil, nil, nil, nil, 'REDSEM_LAYOUT ' .. meta_key .. ' is of the layout before protocol v2:'
      .. ' the next v2 acquisition moves it, once no client of an earlier release holds or waits on it'
  elseif not epoch then
    if ask and ask ~= size then return nil, nil, nil, nil, 'REDSEM_SIZE ' .. msize end
    local err = upgrade(first)
    if err then return nil, nil, nil, nil, err end
    epoch, due = first, 0
  end
  return size, epoch, fence, tonumber(due) or 0, nil, coll, shrink_count(over), shrink_count(held)
end

-- tombstone_of returns acq's tombstone (abort.lua): in meta, or in holders
-- if it was aborted before the semaphore existed.
local function tombstone_of(acq)
  local x = redis.call('HGET', holders_key, 'x:' .. acq)
  return redis.call('HGET', meta_key, 'x:' .. acq) or x
end

-- size_in_force returns the size to work with: the client's, or the stored
-- msize in adopt mode; any other mismatch is REDSEM_SIZE.
local function size_in_force(msize, size, adopt)
  if not msize or msize == size then return size, nil end
  if not adopt then return nil, 'REDSEM_SIZE ' .. msize end
  return msize, nil
end

-- NO_DUE stands for "no lease and no waiter": later than any real score.
local NO_DUE = 9e15

-- create makes the semaphore: size tokens of a new epoch (the first 12
-- characters of seed) at Redis time now (µs). Returns the epoch, or nil and
-- an error: tokens or leases without meta are residue.
local function create(size, seed, now)
  if redis.call('EXISTS', tokens_key) + redis.call('EXISTS', leases_key) > 0 then
    return nil, 'REDSEM_CORRUPT ' .. meta_key .. ' is missing but tokens or leases exist'
  end
  local epoch = string.sub(seed, 1, 12)
  redis.call('HSETNX', meta_key, 'size', size)
  redis.call('HSET', meta_key, 'gen', epoch, 'fence', fmt_int(now), 'due', fmt_int(NO_DUE),
    'rejected', 0, 'created', math.floor(now / 1000))
  -- Tombstones of acquisitions aborted before now move to meta.
  for _, f in ipairs(redis.call('HKEYS', holders_key)) do
    if string.sub(f, 1, 2) == 'x:' then
      redis.call('HSET', meta_key, f, redis.call('HGET', holders_key, f))
      redis.call('HDEL', holders_key, f)
    end
  end
  for i = 1, size, 1000 do
    local batch = {}
    for j = i, math.min(i + 999, size) do batch[#batch + 1] = epoch .. ':' .. j end
    redis.call('RPUSH', tokens_key, unpack(batch))
  end
  return epoch, nil
end

-- next_due is the earliest score in leases and waits, or NO_DUE.
local function next_due()
  local d = NO_DUE
  for _, key in ipairs({leases_key, waits_key}) do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] then d = math.min(d, tonumber(first[2])) end
  end
  return d
end

-- is_valid: tok is "<epoch>:<slot>" of this epoch, 1 <= slot <= size, canonical.
local function is_valid(tok, epoch, size)
  local e, s = string.match(tok, '^([^:]+):([1-9][0-9]*)$')
  if e ~= epoch then return false end
  local n = tonumber(s)
  return n ~= nil and n <= size
end

-- is_retired: tok is a token of this epoch above the size (a shrink's).
local function is_retired(tok, epoch, size)
  local e, s = string.match(tok, '^([^:]+):([1-9][0-9]*)$')
  return e ~= nil and e == epoch and tonumber(s) > size
end

local function owner_of(rec)
  return string.match(rec, '^([^|]*)|')
end

-- each_lease calls f(tok, rec, score) for each token of toks, with its
-- record and deadline (nil when missing), a thousand tokens a read; it
-- stops at, and returns, the first value f returns that is not nil.
local function each_lease(toks, f)
  for i = 1, #toks, 1000 do
    local last = math.min(i + 999, #toks)
    local fields = {}
    for j = i, last do fields[#fields + 1] = 't:' .. toks[j] end
    local recs = redis.call('HMGET', holders_key, unpack(fields))
    local scores = redis.call('ZMSCORE', leases_key, unpack(toks, i, last))
    for j = 1, #fields do
      local r = f(toks[i + j - 1], recs[j], scores[j])
      if r ~= nil then return r end
    end
  end
  return nil
end

-- owned_by returns the tokens of toks whose record names acq, each once,
-- in toks' order.
local function owned_by(acq, toks)
  local mine, seen = {}, {}
  for i = 1, #toks, 1000 do
    local last = math.min(i + 999, #toks)
    local fields = {}
    for j = i, last do fields[#fields + 1] = 't:' .. toks[j] end
    local recs = redis.call('HMGET', holders_key, unpack(fields))
    for j = i, last do
      local rec, tok = recs[j - i + 1], toks[j]
      if rec and owner_of(rec) == acq and not seen[tok] then
        seen[tok] = true
        mine[#mine + 1] = tok
      end
    end
  end
  return mine
end
