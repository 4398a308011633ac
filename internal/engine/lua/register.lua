-- register.lua: a waiter's registration, written in one write with its
-- wait: this (sent with its source, EVAL, so that it never meets NOSCRIPT),
-- BLMOVE tokens pend:<acqID>, and acquire.lua in phase "wait" behind it
-- (oneToken.Queue, once an acquisition of the semaphore in this process
-- waited). It records the waiter as acquire.lua's first call does when no
-- token is free, so that a token the BLMOVE moves is in a pending list
-- that waits lists and the sweep gives back, whether or not the script
-- behind the BLMOVE runs.
-- KEYS: meta, tokens, waits
-- ARGV: size, acqID, blockMs, graceMs
-- Returns {1, free, nowUs}, registered, with free the tokens on the list
-- (the BLMOVE takes one at once); {0} not registered: the semaphore does
-- not exist, is of the layout before protocol v2 (no gen), has another
-- size (size "" takes any), or has a tombstone of acqID, or a key is of
-- the wrong type. Then the BLMOVE must not wait, and
-- the client drops its connection. Writes nothing it does not register.
local meta, tokens, waits = meta_key, tokens_key, waits_key
local size, acq, block_ms, grace_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

local m = redis.pcall('HMGET', meta, 'size', 'due', 'x:' .. acq, 'gen')
if m['err'] or not m[1] or (size ~= '' and m[1] ~= size) or m[3] or not m[4] then return {0} end
local due = tonumber(m[2])
local free = redis.pcall('LLEN', tokens)
if not due or type(free) ~= 'number' then return {0} end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local sweep = now_ms + block_ms + grace_ms
local r = redis.pcall('ZADD', waits, sweep, 'w:' .. acq)
if type(r) == 'table' then return {0} end
if sweep < due then redis.call('HSET', meta, 'due', sweep) end
return {1, free, t[1] .. string.rep('0', 6 - #t[2]) .. t[2]}
