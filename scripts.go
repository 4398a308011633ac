package redsem

import (
	"embed"

	"github.com/gomodule/redigo/redis"
)

//go:embed lua/*.lua
var luaFS embed.FS

// The scripts, each one file in lua/, after the files of helpers it shares
// (Redis scripts cannot import one another): lua/common.lua for all but
// status.lua, and lua/rate_common.lua for the RateGate's. redigo runs them
// with EVALSHA and falls back to EVAL on NOSCRIPT.
var (
	acquireScript = newScript(6, "acquire.lua", "common.lua")
	releaseScript = newScript(4, "release.lua", "common.lua")
	refreshScript = newScript(4, "refresh.lua", "common.lua")
	abortScript   = newScript(6, "abort.lua", "common.lua")
	reclaimScript = newScript(5, "reclaim.lua", "common.lua")
	deleteScript  = newScript(5, "delete.lua", "common.lua")
	statusScript  = newScript(5, "status.lua")

	rateTakeScript  = newScript(rateKeyCount, "rate_take.lua", "common.lua", "rate_common.lua")
	rateAbortScript = newScript(rateKeyCount, "rate_abort.lua", "common.lua", "rate_common.lua")
)

// rateKeyCount is how many keys every rate script takes (see rate_common.lua).
const rateKeyCount = 7

func newScript(keys int, file string, helpers ...string) *redis.Script {
	var src string
	for _, h := range helpers {
		src += mustRead(h) + "\n"
	}
	return redis.NewScript(keys, src+mustRead(file))
}

func mustRead(file string) string {
	b, err := luaFS.ReadFile("lua/" + file)
	if err != nil {
		panic("redsem: missing embedded script " + file)
	}
	return string(b)
}
