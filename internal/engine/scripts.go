package engine

import (
	"embed"

	"github.com/gomodule/redigo/redis"
)

//go:embed lua/*.lua
var luaFS embed.FS

// NewScript returns the script in lua/<file> taking keys keys, after the
// files of helpers it uses (Redis scripts cannot import one another):
// common.lua for every script but status.lua, and rate_common.lua too for
// the rate gate's. redigo runs it with EVALSHA and falls back to EVAL on
// NOSCRIPT.
func NewScript(keys int, file string, helpers ...string) *redis.Script {
	var src string
	for _, h := range helpers {
		src += MustRead(h) + "\n"
	}
	return redis.NewScript(keys, src+MustRead(file))
}

// MustRead returns the source of lua/<file>; it panics when there is no
// such file, which is a build mistake.
func MustRead(file string) string {
	b, err := luaFS.ReadFile("lua/" + file)
	if err != nil {
		panic("redsem: missing embedded script " + file)
	}
	return string(b)
}
