-- fast.lua: for the fast paths (acquire_fast.lua, release_fast.lua), which
-- run before the other helpers are defined.

-- fast_fail is the error reply for e, a pcall error on key.
local function fast_fail(e, key)
  if string.find(e['err'], 'WRONGTYPE', 1, true) then
    return redis.error_reply('REDSEM_WRONGTYPE ' .. key .. ' is of the wrong type')
  end
  return redis.error_reply('TRYAGAIN redsem: ' .. e['err'])
end
