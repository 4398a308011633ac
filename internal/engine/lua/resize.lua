-- resize.lua: set the semaphore's size, atomically (Semaphore.Resize).
-- KEYS: meta, tokens, leases, holders, waits
-- ARGV: n (the new size), seed (random hex: the epoch if this creates the
--       semaphore), and optionally idleMs (WithIdleExpiry of the client,
--       stored if this creates the semaphore, which is then idle)
-- Returns {old, n, minted, removed}; old is 0 when this created the semaphore.
-- Growing mints the tokens of the new slots that are nowhere already;
-- shrinking retires the tokens above n: free ones leave the list, leased
-- ones are dropped when they come back, and as many valid tokens are
-- withheld meanwhile (rebalance), so holders drain down to n.

local n = int_arg(ARGV[1], 1, 100000)
local seed = ARGV[2]
local idle = int_arg(ARGV[3] or '0', 0, 1e12)
if not idle or not n or not seed or #seed < 12 or string.find(seed, '[|:]') then
  return redis.error_reply('REDSEM_ARG invalid arguments to resize')
end
local err = check_types(meta_key, tokens_key, leases_key, holders_key, waits_key)
if err then return redis.error_reply(err) end
local size, epoch, _
size, epoch, _, _, err = read_meta()
if err then return redis.error_reply(err) end

-- push appends toks to the token list, in batches that unpack can take.
local function push(toks)
  for i = 1, #toks, 1000 do
    redis.call('RPUSH', tokens_key, unpack(toks, i, math.min(i + 999, #toks)))
  end
end

-- rebalance sets the shrink's bookkeeping for size n (tokens.lua): over,
-- the leases on retired tokens still out, and as many valid tokens withheld,
-- from those withheld already, then from the free ones. Those no longer
-- needed go back to the list (retired ones are dropped).
local function rebalance(epoch, n)
  local over = 0
  for _, tok in ipairs(redis.call('ZRANGE', leases_key, 0, -1)) do
    if is_retired(tok, epoch, n) then over = over + 1 end
  end
  local old = shrink_count(redis.call('HGET', meta_key, 'held'))
  local cand, keep = {}, {}
  for _, tok in ipairs(withheld()) do
    if is_valid(tok, epoch, n) then cand[#cand + 1] = tok end
  end
  local taken = {}
  while #keep < over and #cand > 0 do
    keep[#keep + 1] = table.remove(cand)
    taken[keep[#keep]] = true
  end
  if #keep < over then
    for _, tok in ipairs(redis.call('LRANGE', tokens_key, 0, -1)) do
      if #keep >= over then break end
      -- A copy of a token leased or withheld already is not free.
      if is_valid(tok, epoch, n) and not taken[tok] and not redis.call('ZSCORE', leases_key, tok)
        and redis.call('LREM', tokens_key, 1, tok) == 1 then
        keep[#keep + 1] = tok
        taken[tok] = true
      end
    end
  end
  push(cand)
  save_shrink(over, old, keep)
end

if not size then
  -- Not created yet: create it with size n, as acquire.lua would.
  local now = now_us()
  _, err = create(n, seed, now)
  if err then return redis.error_reply(err) end
  idle_setting(idle)
  settle_idle(math.floor(now / 1000))
  return {0, n, n, 0}
end
if n == size then return {size, n, 0, 0} end

if n > size then
  -- Where is each token of slots size+1..n now? All reads come first.
  local here = {}
  for _, tok in ipairs(redis.call('LRANGE', tokens_key, 0, -1)) do here[tok] = true end
  for _, w in ipairs(redis.call('ZRANGE', waits_key, 0, -1)) do
    local pend = base() .. 'pend:' .. string.sub(w, 3)
    if not type_err(pend, 'list') then
      for _, tok in ipairs(redis.call('LRANGE', pend, 0, 99)) do here[tok] = true end
    end
  end
  for _, tok in ipairs(withheld()) do here[tok] = true end
  local mint = {}
  for i = size + 1, n do
    local tok = epoch .. ':' .. i
    if not here[tok] and not redis.call('ZSCORE', leases_key, tok) then mint[#mint + 1] = tok end
  end
  redis.call('HSET', meta_key, 'size', n)
  push(mint)
  rebalance(epoch, n)
  settle_idle(math.floor(now_us() / 1000))
  return {size, n, #mint, 0}
end

-- Shrink: keep the list as it is (order, strangers) but for the free tokens
-- this retires. One pass over the list, however many slots go.
local list = redis.call('LRANGE', tokens_key, 0, -1)
local keep = {}
for _, tok in ipairs(list) do
  if not (is_valid(tok, epoch, size) and not is_valid(tok, epoch, n)) then keep[#keep + 1] = tok end
end
redis.call('HSET', meta_key, 'size', n)
local removed = #list - #keep
if removed > 0 then
  redis.call('DEL', tokens_key)
  push(keep)
end
rebalance(epoch, n)
-- The token list may be a new key now: the idle expiry is set afresh.
settle_idle(math.floor(now_us() / 1000))
return {size, n, 0, removed}
