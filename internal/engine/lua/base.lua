-- base.lua: helpers of every script but status.lua; defines, never writes.

-- On Redis Cluster, a script run on the source node of a migrating slot
-- fails at its first access to a key that is not there, keeping the writes
-- before it. So probe with a key that never exists before any write, and
-- answer TRYAGAIN (a cluster client retries after the migration).
do
  local probe = redis.pcall('EXISTS', string.sub(meta_key, 1, #meta_key - 4) .. 'probe')
  if type(probe) == 'table' and probe['err'] then
    return redis.error_reply('TRYAGAIN redsem: slot is migrating')
  end
end

-- FENCE_MAX bounds fences and grant times: Lua numbers are exact up to 2^53.
-- A stored fence at or above it is corruption (REDSEM_CORRUPT).
local FENCE_MAX = 9e15

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- int_arg returns s as a whole number in [lo, hi], or nil.
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

-- base is the common prefix of the script's keys, e.g. "redsem:{name}:".
local function base()
  return string.sub(meta_key, 1, #meta_key - 4)
end

-- not_here returns the READONLY error a write gets on this server, or nil.
-- Redis runs a script that writes nothing on a replica, so a release or
-- refresh sent to a demoted master would report the lease lost: those
-- scripts probe with a ZREM of a member no key holds from key (a sorted set
-- they declare) before they say "not recorded".
local function not_here(key)
  local r = redis.pcall('ZREM', key, '')
  local at = type(r) == 'table' and r['err'] and string.find(r['err'], 'READONLY', 1, true)
  if not at then return nil end
  -- From READONLY on, without the line end: clients classify by first word.
  return redis.error_reply((string.gsub(string.sub(r['err'], at), '%s+$', '')))
end
