// Package failpoint lets fault tests stop a redsem client at exact points of
// its protocol: kill it there, freeze it, or skip a step. Production code
// never sets a hook; an unset hook costs one atomic load.
//
// The points, in the order an acquisition meets them:
//
//	acquire.sent      an acquisition is about to send its first script
//	wait.script       about to queue acquire.lua behind the BLMOVE; a hook
//	                  that returns true skips it, leaving the BLMOVE alone (a
//	                  client that dies between the move and the lease)
//	wait.sent         BLMOVE (and the script) were written, nothing read yet
//	acquire.granted   the grant was read, Acquire has not returned yet
//	release.sent      the release script is about to be written
//	refresh.replied   a Refresh read its reply and has not applied it yet
package failpoint

import "sync/atomic"

var hook atomic.Pointer[func(point string) bool]

// Set installs f as the hook for every point; nil removes it.
func Set(f func(point string) bool) {
	if f == nil {
		hook.Store(nil)
		return
	}
	hook.Store(&f)
}

// Hit runs the hook for point and reports whether it asked to skip the step.
func Hit(point string) bool {
	if f := hook.Load(); f != nil {
		return (*f)(point)
	}
	return false
}
