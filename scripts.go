package redsem

import (
	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// The semaphore's scripts, each one file in internal/engine/lua/ (shared
// with package rate), after common.lua, whose helpers they share
// (status.lua needs none). weighted.go, check.go and resize.go declare
// theirs the same way.
var (
	acquireScript = newScript(6, "acquire.lua", "acquire_fast.lua", "common.lua")
	releaseScript = newScript(4, "release.lua", "release_fast.lua", "common.lua")
	refreshScript = newScript(4, "refresh.lua", "common.lua")
	abortScript   = newScript(6, "abort.lua", "common.lua")
	reclaimScript = newScript(5, "reclaim.lua", "common.lua")
	deleteScript  = newScript(5, "delete.lua", "common.lua")
	statusScript  = newScript(5, "status.lua")
)

// newScript is engine.NewScript: file after its helpers.
func newScript(keys int, file string, helpers ...string) *redis.Script {
	return engine.NewScript(keys, file, helpers...)
}

// mustRead is engine.MustRead: the source of one script file.
func mustRead(file string) string { return engine.MustRead(file) }
