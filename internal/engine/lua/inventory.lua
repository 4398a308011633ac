-- inventory.lua: where every token of the semaphore is, for check.lua and
-- repair.lua (after sweep.lua). It reads only.

-- pend_read bounds how much of one pending list is read (a BLMOVE moves one
-- token, so one is the most a sound list holds).
local pend_read = 100

-- pending_tokens returns the tokens of the pending lists that waits names
-- ("w:" and "x:" members, each list once) and how many such lists hold any.
-- A key of another type under a pending name holds no token of ours.
local function pending_tokens()
  local toks, lists, seen = {}, 0, {}
  for _, w in ipairs(redis.call('ZRANGE', waits_key, 0, -1)) do
    local kind = string.sub(w, 1, 2)
    local pend = base() .. 'pend:' .. string.sub(w, 3)
    local read = (kind == 'w:' or kind == 'x:') and not seen[pend]
    if read then seen[pend] = true end
    local got = read and not type_err(pend, 'list') and redis.call('LRANGE', pend, 0, pend_read - 1) or {}
    if #got > 0 then lists = lists + 1 end
    for _, tok in ipairs(got) do toks[#toks + 1] = tok end
  end
  return toks, lists
end

-- inventory sorts every element of the leases, the pending lists and the
-- token list, read in that order (a lease is the truth, then a token in
-- flight to a waiter), into:
--   leased, pending, held, free
--                          valid tokens, each counted once, in the first
--                          place it was found (held: withheld from the list
--                          while a shrink drains, see tokens.lua)
--   retired                leases on tokens that are not valid now (retired
--                          by a shrink and still held, or forged)
--   dups                   every further copy of a valid token
--   strangers              list and pending elements that are not valid
--                          tokens of this epoch and size
--   missing                slots 1..size found nowhere
--   drop                   the list elements that are strangers or copies
--   pend_lists             how many pending lists hold anything
-- epoch and size are those of meta; with no meta ('' and 0) nothing is valid.
local function inventory(epoch, size)
  local inv = {leased = {}, pending = {}, held = {}, free = {}, retired = {}, dups = {},
    strangers = {}, missing = {}, drop = {}, pend_lists = 0}
  local seen = {}
  local function place(tok, into)
    if not is_valid(tok, epoch, size) then
      inv.strangers[#inv.strangers + 1] = tok
      return false
    end
    if seen[tok] then
      inv.dups[#inv.dups + 1] = tok
      return false
    end
    seen[tok] = true
    into[#into + 1] = tok
    return true
  end
  for _, tok in ipairs(redis.call('ZRANGE', leases_key, 0, -1)) do
    if is_valid(tok, epoch, size) then
      seen[tok] = true
      inv.leased[#inv.leased + 1] = tok
    else
      inv.retired[#inv.retired + 1] = tok
    end
  end
  for _, tok in ipairs(withheld()) do
    place(tok, inv.held)
  end
  local pend
  pend, inv.pend_lists = pending_tokens()
  for _, tok in ipairs(pend) do place(tok, inv.pending) end
  for _, tok in ipairs(redis.call('LRANGE', tokens_key, 0, -1)) do
    if not place(tok, inv.free) then inv.drop[#inv.drop + 1] = tok end
  end
  for i = 1, size do
    if not seen[epoch .. ':' .. i] then inv.missing[#inv.missing + 1] = i end
  end
  return inv
end
