-- codes.lua: the reply codes of the acquisition scripts and their aborts,
-- the first element of every such reply; prepended to every script, before
-- any other helper (engine.CodeWaiting ... engine.CodeReleased in Go, held
-- against these by TestReplyCodesMatch).
local WAITING = 0  -- nothing granted yet: registered as waiting, or refused
local GRANTED = 1  -- granted
local SETTLED = 2  -- settled under this id (aborted, dropped): nothing held
local RELEASED = 3 -- an abort gave a grant back
