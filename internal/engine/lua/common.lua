-- common.lua: shared prologue, prepended by scripts.go to every script except
-- status.lua. It defines helpers only; nothing here writes.
--
-- Key layout (all keys share one hash tag, so one cluster slot):
--   KEYS[1] meta     hash  size, epoch, fence, due, rejected, created,
--                          idle and exp (see Idle expiry below),
--                          "x:"..acqID -> tombstone expiry (see waits),
--                          while a shrink drains over, held and "h:"..i
--                          (see returned)
--   KEYS[2] tokens   list  free tokens; BLMOVE and LPOP take from the left
--   KEYS[3] leases   zset  token -> lease deadline, ms of Redis TIME
--   KEYS[4] holders  hash  "t:"..token -> "acqID|fence|grantedMs|label",
--                          "a:"..acqID -> token,
--                          "x:"..acqID while the semaphore does not exist
--                          (create moves them to meta),
--                          "slow" while a shrink drains or a weighted
--                          collector holds the ticket: then a release
--                          reads meta (see release_fast.lua)
--   KEYS[5] waits    zset  "w:"..acqID -> when its pending list (and the
--                          tokens a weighted collector collected) may be
--                          swept, "x:"..acqID -> when the tombstone of an
--                          aborted acquisition (also in holders) may go
-- A waiter's pending list is base.."pend:"..acqID, where base is KEYS[1]
-- without its "meta" suffix: it shares the tag, so it lives in the same slot.
-- So does a weighted collector's base.."part:"..acqID (see drop_partial).
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

-- FENCE_MAX bounds fences (and the grant times of a RateGate): Lua numbers
-- are doubles, exact up to 2^53, so fence + 1 would stop growing there. A
-- stored fence at or above it can only be corruption (fences are µs of
-- Redis TIME, 1.8e15 in 2027), and the scripts refuse it (REDSEM_CORRUPT)
-- rather than ever grant the same fence twice.
local FENCE_MAX = 9e15

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

-- shrink_count reads a count of meta (a shrink's over and held) as a whole number
-- in [0, 100000] (MaxSize), so that loops over it stay bounded whatever a
-- stranger wrote; nil or junk is 0.
local function shrink_count(s)
  local n = tonumber(s)
  if not n or n ~= n or n < 0 then return 0 end
  return math.min(math.floor(n), 100000)
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
-- (weighted.lua); over and held are the counts of a shrink (see returned).
local function read_meta()
  local m = redis.call('HMGET', KEYS[1], 'size', 'epoch', 'fence', 'due', 'coll', 'over', 'held')
  if not m[1] and not m[2] then return nil, nil, nil, nil, nil end
  local size = tonumber(m[1])
  local fence = tonumber(m[3])
  if not size or size < 1 or not m[2] or not fence then
    return nil, nil, nil, nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' is not a redsem meta record'
  end
  if fence >= FENCE_MAX then
    return nil, nil, nil, nil, 'REDSEM_CORRUPT ' .. KEYS[1] .. ' holds fence ' .. m[3] .. ', too large to grow'
  end
  return size, m[2], fence, tonumber(m[4]) or 0, nil, m[5], shrink_count(m[6]), shrink_count(m[7])
end

-- tombstone_of returns the tombstone of acquisition acq, if it was settled
-- (abort.lua): in meta, or in holders if it was aborted before the
-- semaphore existed.
local function tombstone_of(acq)
  local x = redis.call('HGET', KEYS[4], 'x:' .. acq)
  return redis.call('HGET', KEYS[1], 'x:' .. acq) or x
end

-- size_in_force returns the size an acquisition works with: its own, or
-- the stored one (msize) for a client made WithAdoptSize (Resize changes
-- it; a client's own size only creates the semaphore). A client that
-- disagrees otherwise gets REDSEM_SIZE.
local function size_in_force(msize, size, adopt)
  if msize and msize ~= size then
    if not adopt then return nil, 'REDSEM_SIZE ' .. msize end
    return msize, nil
  end
  return size, nil
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
  -- Tombstones of acquisitions aborted before the semaphore existed wait in
  -- holders; from now on they live in meta, where acquire.lua reads them.
  for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
    if string.sub(f, 1, 2) == 'x:' then
      redis.call('HSET', KEYS[1], f, redis.call('HGET', KEYS[4], f))
      redis.call('HDEL', KEYS[4], f)
    end
  end
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

-- not_here returns the READONLY error a write gets on this server, or nil.
-- A script that finds nothing to do writes nothing, and Redis runs such a
-- script on a replica without complaint: a release or refresh sent to a
-- master that failover demoted would report the lease lost while the new
-- master still records it. So those scripts probe before they say "not
-- recorded": a ZREM of a member no key holds from key (a sorted set the
-- script declares), a write command that a replica refuses before it runs
-- and that is a no-op on a master (nothing replicated; allowed at
-- maxmemory). Any other error of the probe (a key of the wrong type) is
-- the script's own business, not this one's.
local function not_here(key)
  local r = redis.pcall('ZREM', key, '')
  local at = type(r) == 'table' and r['err'] and string.find(r['err'], 'READONLY', 1, true)
  if at then
    -- From READONLY on: Redis 6 prefixes the script's position and leaves
    -- the line end, and the pools classify a reply by its first word.
    return redis.error_reply((string.gsub(string.sub(r['err'], at), '%s+$', '')))
  end
  return nil
end

local function owner_of(rec)
  return string.match(rec, '^([^|]*)|')
end

-- owned_by returns the tokens of toks whose holder record names acq, each
-- once, in toks' order, read a thousand at a time (HMGET holders).
local function owned_by(acq, toks)
  local mine, seen = {}, {}
  for i = 1, #toks, 1000 do
    local last = math.min(i + 999, #toks)
    local fields = {}
    for j = i, last do fields[#fields + 1] = 't:' .. toks[j] end
    local recs = redis.call('HMGET', KEYS[4], unpack(fields))
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

-- each_lease calls f(tok, rec, score) for every token of toks with its
-- holder record and its lease's deadline (nil when missing), read a
-- thousand tokens at a time (HMGET holders, ZMSCORE leases). It stops at,
-- and returns, the first value f returns that is not nil.
local function each_lease(toks, f)
  for i = 1, #toks, 1000 do
    local last = math.min(i + 999, #toks)
    local fields = {}
    for j = i, last do fields[#fields + 1] = 't:' .. toks[j] end
    local recs = redis.call('HMGET', KEYS[4], unpack(fields))
    local scores = redis.call('ZMSCORE', KEYS[3], unpack(toks, i, last))
    for j = 1, #fields do
      local r = f(toks[i + j - 1], recs[j], scores[j])
      if r ~= nil then return r end
    end
  end
  return nil
end

-- base is the common prefix of this semaphore's keys, e.g. "redsem:{name}:".
local function base()
  return string.sub(KEYS[1], 1, #KEYS[1] - 4)
end

-- Idle expiry (WithIdleExpiry). Meta "idle" is the idle time in ms the
-- acquisitions ask for (absent: off); meta "exp" is set, to a time in ms of
-- Redis TIME, while every key of the semaphore expires then (PEXPIREAT, one
-- time for all, so no script sees some keys gone and others not). Only an
-- idle semaphore carries it: every token on the list, no lease, no waiter
-- registered in waits (tombstones only), no weighted queue or collector and
-- no shrink draining (settle_idle). Every script that takes a token, records
-- a lease, registers a waiter or starts a collection calls wake first, in
-- the same script (acquire_fast.lua does the same inline). A waiter blocks
-- only after its registration (a "w:" entry in waits), which keeps the
-- semaphore from being idle until the waiter's script removes it, an abort
-- makes it a tombstone, or a sweep does; and the expiry is never before the
-- last tombstone's, so a late BLMOVE finds either the tombstone or no
-- semaphore at all (then it blocks on a key that does not exist, and what a
-- new epoch hands it is leased by its script like any grant).

-- idle_setting writes the idle time an acquisition asks for into meta when
-- it differs from the stored one (0: off), and keeps holders' "idle" flag in
-- step: release_fast.lua reads meta only when holders has it, so that a
-- release of a semaphore without idle expiry stays four commands. A holders
-- key of the wrong type is left alone here (the script fails on it later,
-- with its undo).
local function idle_setting(idle)
  local cur = tonumber(redis.call('HGET', KEYS[1], 'idle')) or 0
  local flag = redis.pcall('HGET', KEYS[4], 'idle')
  if type(flag) == 'table' then flag = idle > 0 end
  if cur == idle and (idle > 0) == (flag and true or false) then return end
  if idle > 0 then
    redis.call('HSET', KEYS[1], 'idle', fmt_int(idle))
    redis.pcall('HSET', KEYS[4], 'idle', 1)
  else
    redis.call('HDEL', KEYS[1], 'idle')
    redis.pcall('HDEL', KEYS[4], 'idle')
  end
end

-- idle_keys are the keys that may exist while the semaphore is idle (not
-- leases: settle_idle sets nothing while it exists).
local function idle_keys()
  return {KEYS[1], KEYS[2], KEYS[4], base() .. 'waits'}
end

-- wake removes the idle expiry, if set: the semaphore is in use again.
local function wake()
  if not redis.call('HGET', KEYS[1], 'exp') then return end
  for _, key in ipairs(idle_keys()) do redis.call('PERSIST', key) end
  redis.call('HDEL', KEYS[1], 'exp')
end

-- settle_idle sets the idle expiry when the semaphore is idle and meta asks
-- for one, on every key it has now (a script that rebuilt the token list,
-- resize.lua or repair.lua, calls it too): at now_ms plus the idle time, or
-- at the last tombstone's expiry if that is later. Otherwise it removes any
-- expiry (wake).
local function settle_idle(now_ms)
  local m = redis.call('HMGET', KEYS[1], 'size', 'idle', 'coll', 'over', 'held')
  local size, idle = tonumber(m[1]), tonumber(m[2])
  if not size or not idle or idle <= 0 or m[3] or m[4] or m[5] then return wake() end
  local n = redis.pcall('LLEN', KEYS[2])
  if n ~= size or redis.call('EXISTS', KEYS[3], base() .. 'wqueue') > 0 then return wake() end
  local at = now_ms + idle
  local waits = base() .. 'waits'
  if type_err(waits, 'zset') then return wake() end
  local w = redis.call('ZRANGE', waits, 0, -1, 'WITHSCORES')
  for i = 1, #w, 2 do
    if string.sub(w[i], 1, 2) ~= 'x:' then return wake() end
    at = math.max(at, tonumber(w[i + 1]))
  end
  for _, key in ipairs(idle_keys()) do redis.call('PEXPIREAT', key, fmt_int(at)) end
  redis.call('HSET', KEYS[1], 'exp', fmt_int(at))
end

-- is_retired reports whether tok is a token of this epoch above the size:
-- retired by a shrink.
local function is_retired(tok, epoch, size)
  local e, s = string.match(tok, '^([^:]+):([1-9][0-9]*)$')
  return e ~= nil and e == epoch and tonumber(s) > size
end

-- A shrink's bookkeeping, in meta while it drains (resize.lua sets it,
-- returned settles it):
--   over       the leases on retired tokens still out
--   held       how many valid tokens are withheld meanwhile, at most over
--   "h:"..i    the withheld tokens, i = 1..held: a stack, so that a token
--              is withheld or given back with O(1) work whatever the size
-- Holders drain down to the new size, and none is granted above it
-- meanwhile; each retired lease that ends lets one withheld token go back.
-- All of it goes when over reaches 0.

-- withheld returns the withheld tokens, h:1..h:held; a missing entry
-- (damage) is skipped.
local function withheld()
  local n = shrink_count(redis.call('HGET', KEYS[1], 'held'))
  local toks = {}
  for i = 1, n, 1000 do
    local f = {}
    for j = i, math.min(i + 999, n) do f[#f + 1] = 'h:' .. j end
    for _, tok in ipairs(redis.call('HMGET', KEYS[1], unpack(f))) do
      if tok then toks[#toks + 1] = tok end
    end
  end
  return toks
end

-- save_shrink replaces the bookkeeping, old withheld tokens, with over and
-- the withheld tokens keep (resize.lua; #keep <= over).
local function save_shrink(over, old, keep)
  -- holders "slow" makes every release read meta (see release_fast.lua),
  -- set before the shrink's bookkeeping.
  if over > 0 then redis.call('HSET', KEYS[4], 'slow', 1) end
  local gone = {}
  for i = #keep + 1, old do gone[#gone + 1] = 'h:' .. i end
  if over == 0 then gone[#gone + 1] = 'over' end
  if #keep == 0 then gone[#gone + 1] = 'held' end
  for i = 1, #gone, 1000 do
    redis.call('HDEL', KEYS[1], unpack(gone, i, math.min(i + 999, #gone)))
  end
  local set = {}
  for i, tok in ipairs(keep) do
    set[#set + 1] = 'h:' .. i
    set[#set + 1] = tok
  end
  if over > 0 then
    set[#set + 1] = 'over'
    set[#set + 1] = over
  end
  if #keep > 0 then
    set[#set + 1] = 'held'
    set[#set + 1] = #keep
  end
  for i = 1, #set, 1000 do
    redis.call('HSET', KEYS[1], unpack(set, i, math.min(i + 999, #set)))
  end
end

-- returned puts valid tokens that came back onto the token list, and takes
-- note of retired_n leases on retired tokens that ended. While a shrink
-- drains (see above), a valid token is withheld instead while fewer than
-- over are, and each retired lease that ended lets one go back (the last
-- withheld first). With no shrink under way (no 'over'), it is a plain
-- LPUSH. over and held may be passed when the caller read meta; else they
-- are read here. Its work is O(1) per token, whatever the size
-- (release_fast.lua does the same for a release of one token: keep the two
-- in step). Returns an error string if the list is not a list (then
-- nothing was written).
local function returned(valid, retired_n, over, held)
  if over == nil then
    local m = redis.call('HMGET', KEYS[1], 'over', 'held')
    over, held = shrink_count(m[1]), shrink_count(m[2])
  end
  local shrinking = over > 0 or held > 0
  local push, set, gone, n = valid, {}, {}, held
  if shrinking then
    over = math.max(over - retired_n, 0)
    push = {}
    for _, tok in ipairs(valid) do
      if n < over then
        n = n + 1
        set[#set + 1] = 'h:' .. n
        set[#set + 1] = tok
      else
        push[#push + 1] = tok
      end
    end
    for i = n, over + 1, -1 do
      local tok = redis.call('HGET', KEYS[1], 'h:' .. i)
      if tok then push[#push + 1] = tok end
      gone[#gone + 1] = 'h:' .. i
    end
    n = math.min(n, over)
  end
  for i = 1, #push, 1000 do
    local r = redis.pcall('LPUSH', KEYS[2], unpack(push, i, math.min(i + 999, #push)))
    if type(r) == 'table' and r['err'] then
      return 'REDSEM_WRONGTYPE ' .. KEYS[2] .. ' is not a list'
    end
  end
  if shrinking then
    if over == 0 then gone[#gone + 1] = 'over' else set[#set + 1] = 'over'; set[#set + 1] = over end
    if n == 0 then gone[#gone + 1] = 'held' else set[#set + 1] = 'held'; set[#set + 1] = n end
    for i = 1, #gone, 1000 do
      redis.call('HDEL', KEYS[1], unpack(gone, i, math.min(i + 999, #gone)))
    end
    for i = 1, #set, 1000 do
      redis.call('HSET', KEYS[1], unpack(set, i, math.min(i + 999, #set)))
    end
  end
  return nil
end

-- withhold keeps tok, a valid free token on its way to a grant (popped from
-- the token list or from a pending list), from that grant while a shrink
-- drains and fewer valid tokens are withheld than leases on retired tokens
-- are out (see returned): granting it would put more holders out than the
-- size. over is meta 'over' as the script read it first: 'over' only falls
-- while a script runs (only resize.lua raises it), so with 0 there is
-- nothing to read; else the bookkeeping is read afresh, as the script may
-- have changed it since. Returns true when tok was withheld.
local function withhold(tok, over)
  if over <= 0 then return false end
  local m = redis.call('HMGET', KEYS[1], 'over', 'held')
  local held = shrink_count(m[2])
  over = shrink_count(m[1])
  if held >= over then return false end
  returned({tok}, 0, over, held)
  return true
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

-- A weighted acquisition that collects (weighted.lua) lists the tokens it
-- has so far in base.."part:"..acqID, oldest first; each is also a lease of
-- its own, recorded "acqID|0|ms|label" until the grant. Its registration in
-- waits lapses a moment after the collector stops checking in, and the
-- sweep (reclaim) then gives them back; PARTIAL_MS, the deadline of those
-- leases, is only a backstop, pushed forward while the collector lives.
local PARTIAL_MS = 3600000

local function part_of(acq)
  return base() .. 'part:' .. acq
end

-- drop_partial gives back the tokens in acq's part list that are still
-- leased to it (their record names acq; anything else listed there is not
-- acq's any more and is left alone) and deletes the list. Freeing writes
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
    redis.call('ZREM', KEYS[3], unpack(mine, i, last))
    redis.call('HDEL', KEYS[4], unpack(fields))
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
  if strays > 0 then redis.call('HINCRBY', KEYS[1], 'rejected', strays) end
  return #valid
end

-- overdue reads what reclaim gives back at now_ms: the leases that expired
-- and the entries of waits gone stale (pending lists whose waiter never
-- confirmed, tombstones), at most limit of each. It only reads, so that a
-- script can call it before its first write: it returns nil and an error
-- when a stale entry's pending list is of the wrong type (a stranger wrote
-- it; the token it held is not ours to guess).
-- LATE_MS is how long the registration of a waiter whose pending list was
-- swept stays as a tombstone: longer than a written BLMOVE plausibly takes to
-- reach Redis (the client writes none once its registration may be swept).
local LATE_MS = 60000

local function overdue(now_ms, limit)
  local due_now = {
    now_ms = now_ms,
    expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms, 'LIMIT', 0, limit),
    stale = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms, 'LIMIT', 0, limit),
  }
  -- parts: the stale registrations with a part list to sweep (one of
  -- another type is a stranger's: left alone, its leases lapse by PARTIAL_MS).
  due_now.parts = {}
  for _, w in ipairs(due_now.stale) do
    local e = type_err(base() .. 'pend:' .. string.sub(w, 3), 'list')
    if e then return nil, e end
    if string.sub(w, 1, 2) == 'w:' then
      local t = redis.call('TYPE', part_of(string.sub(w, 3)))
      if type(t) == 'table' then t = t['ok'] end
      if t == 'list' then due_now.parts[w] = true end
    end
  end
  return due_now, nil
end

-- reclaim returns the tokens of the leases that expired and of the pending
-- lists gone stale that overdue found, and returns how many went back. The
-- freeing writes (ZREM, HDEL, DEL) come before the push, so reclaim still
-- works when Redis is out of memory.
local function reclaim(due_now, epoch, size)
  local n = 0
  for _, tok in ipairs(due_now.expired) do
    redis.call('ZREM', KEYS[3], tok)
    local rec = redis.call('HGET', KEYS[4], 't:' .. tok)
    if rec then
      redis.call('HDEL', KEYS[4], 't:' .. tok, 'a:' .. (owner_of(rec) or ''))
    end
    n = n + give_back(tok, epoch, size, true)
  end
  local late = {}
  for _, w in ipairs(due_now.stale) do
    if string.sub(w, 1, 2) == 'x:' then
      redis.call('HDEL', KEYS[1], w)
      redis.call('HDEL', KEYS[4], w)
    else
      late[#late + 1] = 'x:' .. string.sub(w, 3)
    end
    local pend = base() .. 'pend:' .. string.sub(w, 3)
    local toks = redis.call('LRANGE', pend, 0, 9)
    redis.call('DEL', pend)
    redis.call('ZREM', KEYS[5], w)
    for _, tok in ipairs(toks) do n = n + give_back(tok, epoch, size) end
    -- A weighted collector that stopped checking in: what it collected.
    if due_now.parts[w] then n = n + drop_partial(string.sub(w, 3), epoch, size) end
  end
  -- A waiter that never confirmed may still have a BLMOVE on its way (a
  -- paused process, a slow network): its registration becomes a tombstone
  -- for LATE_MS, as abort.lua leaves one. A late lease script then grants
  -- nothing and gives back, and a token a late BLMOVE moved into the
  -- pending list is swept once more when the tombstone goes. (Written after
  -- the push: at maxmemory the tokens are back first.)
  for _, x in ipairs(late) do
    redis.call('ZADD', KEYS[5], due_now.now_ms + LATE_MS, x)
    redis.call('HSET', epoch and KEYS[1] or KEYS[4], x, fmt_int(due_now.now_ms + LATE_MS))
  end
  return n
end
