package redsem

import (
	"embed"

	"github.com/gomodule/redigo/redis"
)

//go:embed lua/*.lua
var luaFS embed.FS

// The scripts, each one file in lua/. All but status.lua start with
// lua/common.lua, which holds the helpers they share (Redis scripts cannot
// import one another). redigo runs them with EVALSHA and falls back to EVAL on
// NOSCRIPT.
var (
	acquireScript = newScript(6, "acquire.lua", true)
	releaseScript = newScript(4, "release.lua", true)
	refreshScript = newScript(4, "refresh.lua", true)
	abortScript   = newScript(6, "abort.lua", true)
	reclaimScript = newScript(5, "reclaim.lua", true)
	deleteScript  = newScript(5, "delete.lua", true)
	statusScript  = newScript(5, "status.lua", false)
)

func newScript(keys int, file string, common bool) *redis.Script {
	src := mustRead(file)
	if common {
		src = mustRead("common.lua") + "\n" + src
	}
	return redis.NewScript(keys, src)
}

func mustRead(file string) string {
	b, err := luaFS.ReadFile("lua/" + file)
	if err != nil {
		panic("redsem: missing embedded script " + file)
	}
	return string(b)
}
