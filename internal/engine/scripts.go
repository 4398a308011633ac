package engine

import (
	"embed"
	"fmt"
	"strings"
	"sync"

	"github.com/gomodule/redigo/redis"
)

//go:embed lua/*.lua
var luaFS embed.FS

// NewScript returns the script in lua/<file> taking keys keys, after the
// files of helpers it uses (Redis scripts cannot import one another):
// codes.lua (the reply codes) for every script, always first; common.lua
// for every script but status.lua, and rate_common.lua too for the rate
// gate's. redigo runs it with EVALSHA and falls back to EVAL on
// NOSCRIPT.
//
// Each call is recorded (Declarations), so that a test can hold what Go
// declares against each script's own "-- KEYS:" header (HeaderKeys).
func NewScript(keys int, file string, helpers ...string) *redis.Script {
	helpers = append([]string{"codes.lua"}, helpers...)
	declMu.Lock()
	declared = append(declared, Declaration{File: file, Keys: keys, Helpers: helpers})
	declMu.Unlock()
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

// Declaration is a script as Go declares it: its file, how many of its
// arguments are keys, and the helper files it runs after.
type Declaration struct {
	File    string
	Keys    int
	Helpers []string
}

var (
	declMu   sync.Mutex
	declared []Declaration
)

// Declarations returns every script NewScript has made so far, in order.
func Declarations() []Declaration {
	declMu.Lock()
	defer declMu.Unlock()
	return append([]Declaration(nil), declared...)
}

// HeaderKeys returns the key names that lua/<file> lists on its
// "-- KEYS:" header line (a note in parentheses after a name is dropped),
// or an error when it has none.
func HeaderKeys(file string) ([]string, error) {
	for _, line := range strings.Split(MustRead(file), "\n") {
		rest, ok := strings.CutPrefix(line, "-- KEYS:")
		if !ok {
			continue
		}
		var names []string
		depth, cur := 0, ""
		for _, r := range rest + "," {
			switch {
			case r == '(':
				depth++
			case r == ')':
				depth--
			case r == ',' && depth == 0:
				if name := strings.TrimSpace(cur); name != "" {
					names = append(names, name)
				}
				cur = ""
			case depth == 0:
				cur += string(r)
			}
		}
		return names, nil
	}
	return nil, fmt.Errorf("%s has no \"-- KEYS:\" header", file)
}
