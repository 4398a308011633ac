package redsem

import (
	"sync/atomic"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// hookPool injects faults into a pool's connections (redistest.HookPool).
type hookPool = redistest.HookPool

var errLostReply = redistest.ErrLostReply

// isScript reports whether a command runs the given script.
func isScript(s *engine.Script, cmd string, args []interface{}) bool {
	return redistest.IsScript(s, cmd, args)
}

// loseReply returns a pool that loses the reply of the next run of script
// (after Redis ran it) while lose is true, and clears lose when it does.
func loseReply(p Pool, script *engine.Script, armed bool) (*hookPool, *atomic.Bool) {
	lose := &atomic.Bool{}
	lose.Store(armed)
	return &hookPool{Pool: p, AfterDo: func(cmd string, args []interface{}) error {
		if isScript(script, cmd, args) && lose.Swap(false) {
			return errLostReply
		}
		return nil
	}}, lose
}
