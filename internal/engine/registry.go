package engine

// The registry: every script redsem runs, declared here and nowhere else,
// each as its file in lua/, the number of keys it takes (named on its
// "-- KEYS:" header line) and the helpers it runs after. Its arguments are
// named on its "-- ARGV:" header, and every call names them the same way
// (Args): RunScript refuses a call whose names or count differ before
// anything is sent (ErrArity). Its replies start with a code named in
// codes.lua.
// TestScriptHeadersMatchDeclarations holds each declaration against its
// headers, and every file in lua/ is an entry script here or a helper of
// one, never both.
var (
	// The semaphore's (and mutex's). A *_fast.lua helper is a fast path:
	// it runs before the other helpers are defined and serves the common
	// case itself, as the rest of its script would
	// (TestFastPathsMatchSlowPaths).
	Acquire  = NewScript(6, "acquire.lua", "fast.lua", "acquire_fast.lua", "common.lua")
	Release  = NewScript(4, "release.lua", "fast.lua", "release_fast.lua", "common.lua", "weighted.lua")
	Refresh  = NewScript(4, "refresh.lua", "common.lua")
	Abort    = NewScript(6, "abort.lua", "common.lua")
	Reclaim  = NewScript(5, "reclaim.lua", "common.lua")
	Delete   = NewScript(5, "delete.lua", "common.lua")
	Status   = NewScript(5, "status.lua")
	Resize   = NewScript(5, "resize.lua", "common.lua")
	Check    = NewScript(5, "check.lua", "common.lua", "inventory.lua")
	Repair   = NewScript(5, "repair.lua", "common.lua", "inventory.lua")
	AcquireN = NewScript(8, "acquire_n.lua", "common.lua", "weighted.lua")
	AbortN   = NewScript(8, "abort_n.lua", "common.lua", "weighted.lua")

	// The read-write lock's.
	RWAcquire = NewScript(6, "rw_acquire.lua", "common.lua", "rw_common.lua")
	RWAbort   = NewScript(6, "rw_abort.lua", "common.lua", "rw_common.lua")
	RWRelease = NewScript(5, "rw_release.lua", "common.lua", "rw_common.lua")
	RWRefresh = NewScript(5, "rw_refresh.lua", "common.lua", "rw_common.lua")

	// The rate gate's (package rate): RateKeys keys for a start, its state
	// keys (RateStateKeys) for the others.
	RateTake   = NewScript(RateKeys, "rate_take.lua", "common.lua", "rate_common.lua")
	RateAbort  = NewScript(RateKeys, "rate_abort.lua", "common.lua", "rate_common.lua")
	RateSet    = NewScript(RateStateKeys, "rate_set.lua", "common.lua", "rate_common.lua")
	RateStatus = NewScript(RateStateKeys, "rate_status.lua", "common.lua", "rate_common.lua")
)
