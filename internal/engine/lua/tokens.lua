-- tokens.lua: giving tokens back, and a shrink's bookkeeping (after
-- idle.lua).
--
-- While a shrink drains (resize.lua sets it, returned settles it), meta holds
--   over      the leases on retired tokens still out
--   held      how many valid tokens are withheld meanwhile, at most over
--   "h:"..i   the withheld tokens, i = 1..held: a stack (O(1) a token)
-- so holders drain down to the new size. Each retired lease that ends lets
-- one withheld token go back; all of it goes when over reaches 0.

-- withheld returns the withheld tokens (a missing entry is skipped).
local function withheld()
  local n = shrink_count(redis.call('HGET', meta_key, 'held'))
  local toks = {}
  for i = 1, n, 1000 do
    local f = {}
    for j = i, math.min(i + 999, n) do f[#f + 1] = 'h:' .. j end
    for _, tok in ipairs(redis.call('HMGET', meta_key, unpack(f))) do
      if tok then toks[#toks + 1] = tok end
    end
  end
  return toks
end

-- withheld_set returns the withheld tokens as a set, empty while no
-- shrink drains (over as meta said): a copy of a withheld token is in no
-- lease, yet no free token (a stranger's push, or a duplicate).
local function withheld_set(over)
  local set = {}
  if over > 0 then
    for _, tok in ipairs(withheld()) do set[tok] = true end
  end
  return set
end

-- hset_all and hdel_all write or delete fields of meta, a thousand a command.
local function hset_all(set)
  for i = 1, #set, 1000 do
    redis.call('HSET', meta_key, unpack(set, i, math.min(i + 999, #set)))
  end
end

local function hdel_all(gone)
  for i = 1, #gone, 1000 do
    redis.call('HDEL', meta_key, unpack(gone, i, math.min(i + 999, #gone)))
  end
end

-- save_shrink replaces the bookkeeping (old withheld tokens) with over and
-- the withheld tokens keep (resize.lua; #keep <= over).
local function save_shrink(over, old, keep)
  -- holders "slow" sends every release through meta, set first.
  if over > 0 then redis.call('HSET', holders_key, 'slow', 1) end
  local gone = {}
  for i = #keep + 1, old do gone[#gone + 1] = 'h:' .. i end
  if over == 0 then gone[#gone + 1] = 'over' end
  if #keep == 0 then gone[#gone + 1] = 'held' end
  hdel_all(gone)
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
  hset_all(set)
end

-- returned puts valid tokens that came back onto the list, and notes
-- retired_n leases on retired tokens that ended. While a shrink drains, a
-- valid token is withheld instead while fewer than over are, and each
-- retired lease that ended lets the last withheld one go back. over and
-- held may be passed when the caller read meta. A valid token that is a
-- copy of a withheld one is dropped, unless the caller passes checked: none
-- is (its leases just ended, and a withheld token is never leased, or it
-- checked them against withheld_set), which spares reading every withheld
-- token (O(1) a token). Returns an error string, with nothing written, when
-- the list is not a list.
local function returned(valid, retired_n, over, held, checked)
  if over == nil then
    local m = redis.call('HMGET', meta_key, 'over', 'held')
    over, held = shrink_count(m[1]), shrink_count(m[2])
  end
  local shrinking = over > 0 or held > 0
  local push, set, gone, n = valid, {}, {}, held
  if shrinking then
    local kept = checked and {} or withheld_set(held)
    over = math.max(over - retired_n, 0)
    push = {}
    for _, tok in ipairs(valid) do
      if kept[tok] then
        redis.call('HINCRBY', meta_key, 'rejected', 1) -- a copy: dropped
      elseif n < over then
        kept[tok] = true
        n = n + 1
        set[#set + 1] = 'h:' .. n
        set[#set + 1] = tok
      else
        push[#push + 1] = tok
      end
    end
    for i = n, over + 1, -1 do
      local tok = redis.call('HGET', meta_key, 'h:' .. i)
      if tok then push[#push + 1] = tok end
      gone[#gone + 1] = 'h:' .. i
    end
    n = math.min(n, over)
  end
  for i = 1, #push, 1000 do
    local r = redis.pcall('LPUSH', tokens_key, unpack(push, i, math.min(i + 999, #push)))
    if type(r) == 'table' and r['err'] then
      return 'REDSEM_WRONGTYPE ' .. tokens_key .. ' is not a list'
    end
  end
  if not shrinking then return nil end
  if over == 0 then gone[#gone + 1] = 'over' else set[#set + 1] = 'over'; set[#set + 1] = over end
  if n == 0 then gone[#gone + 1] = 'held' else set[#set + 1] = 'held'; set[#set + 1] = n end
  hdel_all(gone)
  hset_all(set)
  return nil
end

-- withhold keeps tok, a valid free token on its way to a grant, from it
-- while a shrink drains and fewer tokens are withheld than over. over is
-- meta's as the script first read it: it only falls while a script runs,
-- so with 0 there is nothing to read. kept is withheld_set(over), kept up
-- to date here; the caller drops a token in it (a copy of a withheld one).
-- Returns true when tok was withheld.
local function withhold(tok, over, kept)
  if over <= 0 then return false end
  local m = redis.call('HMGET', meta_key, 'over', 'held')
  local held = shrink_count(m[2])
  over = shrink_count(m[1])
  if held >= over then return false end
  returned({tok}, 0, over, held, true)
  kept[tok] = true
  return true
end

-- give_back returns tok onto the list (through returned) if it is valid and
-- not leased; leased says it was a lease that just ended, so a retired one
-- settles a shrink's count. Anything else is dropped and counted as
-- rejected. Returns 1 when pushed or withheld.
local function give_back(tok, epoch, size, leased)
  if epoch and is_valid(tok, epoch, size) and not redis.call('ZSCORE', leases_key, tok) then
    returned({tok}, 0)
    return 1
  end
  if epoch and leased and is_retired(tok, epoch, size) then
    returned({}, 1)
    return 0
  end
  if epoch then redis.call('HINCRBY', meta_key, 'rejected', 1) end
  return 0
end

-- unmoved is the error reply e. moved: the script runs behind a waiter's
-- BLMOVE (tokens -> pend), undone first: the token goes back to the head of
-- the token list, where it was. Left in the pending list, it would wait for
-- a sweep that finds the list through its registration in waits, which a
-- stranger's key may have taken. A token a shrink retired while it was on
-- its way (the shrink sees no pending list) is dropped instead, as
-- give_back drops it.
local function unmoved(moved, e)
  local toks = moved and redis.pcall('LRANGE', pend_key, 0, 99)
  if type(toks) == 'table' and #toks > 0 and #toks < 100 then
    local m = redis.pcall('HMGET', meta_key, 'gen', 'size', 'exp')
    local epoch = not m['err'] and m[1]
    local size = epoch and int_arg(m[2], 1, 100000) -- a corrupt size drops nothing
    local back, retired = {}, 0
    for i = #toks, 1, -1 do
      if size and is_retired(toks[i], epoch, size) then
        retired = retired + 1
      else
        back[#back + 1] = toks[i]
      end
    end
    if #back == 0 or type(redis.pcall('LPUSH', tokens_key, unpack(back))) == 'number' then
      redis.call('DEL', pend_key)
      if retired > 0 then redis.pcall('HINCRBY', meta_key, 'rejected', retired) end
      -- A list the move had emptied comes back without the idle expiry
      -- the other keys still have.
      local exp = not m['err'] and m[3]
      if type(exp) == 'string' then redis.pcall('PEXPIREAT', tokens_key, exp) end
    end
  end
  return redis.error_reply(e)
end
