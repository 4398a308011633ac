-- floor:kept, what its three scripts share (prepended to each): a lease
-- kept the way a release of commands alone needs it, with redsem's
-- promises on the grant. The token stays on its holder's own list
-- (<tokens>:held:<acq>) while it is held; the lease is the member acq of
-- the leases zset, scored by its deadline (a registered waiter is the same
-- member, scored by when it may be swept, which the grant moves to the
-- deadline: no removal); the record and the guard live in one hash beside
-- meta's fields: a:<acq> (token|fence) for the holder, t:<token> (acq) for
-- the duplicate guard, which the release leaves behind (a release of
-- commands cannot check whose it is) and the next grant of the token
-- overwrites once the acquisition it names no longer holds the token.
-- KEYS[1]: tokens or the holder's list; KEYS[2]: leases; the other keys
-- are named from leases (one Redis, not a cluster).
local leases = KEYS[2]
local base = string.sub(leases, 1, #leases - 7)
local meta = base .. ':holders'
local acq, ttl = ARGV[1], tonumber(ARGV[2])
local held = base .. ':held:' .. acq

-- Registrations may be swept this long (ms) after their wait would have
-- timed out.
local grace = 5000

-- now returns Redis's TIME in ms, and in µs as a string.
local function now()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000), t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- grant records the lease of tok, on held already: meta read once (size,
-- epoch, fence, due, the acquisition's tombstone and the token's last
-- holder), the guard, the fence (TIME's µs, above the last), the record
-- and the deadline. Returns {token, fence}, or nil when tok was dropped:
-- not one of the size's tokens (forged, or of another epoch: the floor's
-- tokens are 1..size), or a copy of a token its last holder still has.
local function grant(tok)
  local ms, us = now()
  local m = redis.call('HMGET', meta, 'size', 'gen', 'fence', 'due', 'x:' .. acq, 't:' .. tok)
  local slot, size, prev = tonumber(tok), tonumber(m[1]), m[6]
  if not (slot and size and slot >= 1 and slot <= size and slot % 1 == 0)
    or (prev and prev ~= acq and redis.call('LINDEX', base .. ':held:' .. prev, 0) == tok) then
    redis.call('LREM', held, 1, tok)
    return nil
  end
  local fence = us
  if m[3] and tonumber(m[3]) >= tonumber(us) then fence = string.format('%.0f', tonumber(m[3]) + 1) end
  redis.call('HSET', meta, 'fence', fence, 't:' .. tok, acq, 'a:' .. acq, tok .. '|' .. fence)
  redis.call('ZADD', leases, ms + ttl, acq)
  return {tok, fence}
end

-- sweep gives back what expired by ms (16 at most a call): whatever token
-- is on the list of a lease past its deadline or of a waiter whose record
-- never ran.
local function sweep(ms)
  for _, a in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', ms, 'LIMIT', 0, 16)) do
    redis.call('LMOVE', base .. ':held:' .. a, base, 'LEFT', 'LEFT')
    redis.call('ZREM', leases, a)
    redis.call('HDEL', meta, 'a:' .. a)
  end
end
