package redsem

import (
	"github.com/redsem/redsem/internal/engine"
)

// The scripts of semaphores, mutexes and read-write locks, declared in the
// engine's registry (internal/engine/registry.go), each one file in
// internal/engine/lua/. They are variables so that a test can swap one.
var (
	acquireScript  = engine.Acquire
	releaseScript  = engine.Release
	refreshScript  = engine.Refresh
	abortScript    = engine.Abort
	reclaimScript  = engine.Reclaim
	deleteScript   = engine.Delete
	statusScript   = engine.Status
	resizeScript   = engine.Resize
	checkScript    = engine.Check
	repairScript   = engine.Repair
	acquireNScript = engine.AcquireN
	abortNScript   = engine.AbortN

	rwAcquireScript = engine.RWAcquire
	rwAbortScript   = engine.RWAbort
	rwReleaseScript = engine.RWRelease
	rwRefreshScript = engine.RWRefresh
)

// mustRead is engine.MustRead: the source of one script file.
func mustRead(file string) string { return engine.MustRead(file) }
