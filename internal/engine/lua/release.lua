-- release.lua: give back leased tokens, only those this acquisition owns.
-- KEYS: meta, tokens, leases, holders
-- ARGV: token, acqID, then the other tokens of a weighted lease (if any)
-- Returns how many tokens were released: 0 when the lease is no longer
-- recorded (expired and reclaimed, released before, semaphore lost).
-- The first write is ZREM, which frees memory: release works at OOM. While
-- a collector holds the ticket and a token (weighted.lua), released tokens
-- go to it, until it has all it asked for, and ring its doorbell.

if settle_after_fast then
  -- release_fast.lua released the token and left the idle expiry to this.
  settle_idle(math.floor(now_us() / 1000))
  return 1
end

local acq = ARGV[2]
local toks = {ARGV[1]}
for i = 3, #ARGV do toks[#toks + 1] = ARGV[i] end
-- Reads and checks first: a key of the wrong type fails with nothing changed.
local owned = owned_by(acq, toks)
if #owned == 0 then return not_here(leases_key) or 0 end
local size, epoch, _, due, err, coll, over, held = read_meta()
if err then return redis.error_reply(err) end
local back, routed, retired = {}, {}, 0
for _, tok in ipairs(owned) do
  if epoch and is_valid(tok, epoch, size) then
    back[#back + 1] = tok
  elseif epoch and is_retired(tok, epoch, size) then
    retired = retired + 1
  end
end
-- A retired token may let a withheld one go back (returned): check then too.
if #back > 0 or retired > 0 then
  local n = redis.pcall('LLEN', tokens_key)
  if type(n) == 'table' and n['err'] then
    return redis.error_reply('REDSEM_WRONGTYPE ' .. tokens_key .. ' is not a list')
  end
end
-- A collector to route to (not while a shrink drains)? A part list of
-- another type is a stranger's, and routes nothing.
local c, now_ms
if coll and #back > 0 and over == 0 then
  c = parse_coll(coll)
  now_ms = math.floor(now_us() / 1000)
  if not (c and c.acq ~= acq and c.have > 0 and c.have < c.k and c.dl > now_ms)
    or type_err(part_of(c.acq), 'list') then
    c = nil
  end
end
for i = 1, #owned, 1000 do
  redis.call('ZREM', leases_key, unpack(owned, i, math.min(i + 999, #owned)))
end

if c then
  local route, rest = {}, {}
  for _, tok in ipairs(back) do
    if c.have < c.k then
      route[#route + 1] = tok
      c.have = c.have + 1
      routed[tok] = true
    else
      rest[#rest + 1] = tok
    end
  end
  local score = now_ms + PARTIAL_MS
  lease_all(route, score, c.acq .. '|0|' .. now_ms .. '|' .. c.label)
  push_part(part_of(c.acq), route)
  redis.call('HSET', meta_key, 'coll', coll_string(c))
  if score < due then redis.call('HSET', meta_key, 'due', fmt_int(score)) end
  -- With all k it is woken to seal its grant.
  if c.have == c.k then ring(c.acq, c.dl - now_ms) end
  back = rest
end

-- Onto the list, or withheld while a shrink drains (see returned).
if epoch then
  -- The token list was checked above, so this does not fail half way.
  local perr = returned(back, retired, over, held, true)
  if perr then return redis.error_reply(perr) end
end
local gone = {}
for _, tok in ipairs(owned) do
  if not routed[tok] then gone[#gone + 1] = 't:' .. tok end
end
gone[#gone + 1] = 'a:' .. acq
-- Neither a collector nor a shrink left: release_fast.lua may serve again.
if not coll and over == 0 and held == 0 then gone[#gone + 1] = 'slow' end
for i = 1, #gone, 1000 do
  redis.call('HDEL', holders_key, unpack(gone, i, math.min(i + 999, #gone)))
end
if epoch then settle_idle(math.floor(now_us() / 1000)) end
return #owned
