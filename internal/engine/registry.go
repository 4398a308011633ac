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
	Acquire  = NewScript(6, "acquire.lua", with([]string{"fast.lua", "acquire_fast.lua"}, semaphore)...)
	Release  = NewScript(4, "release.lua", with([]string{"fast.lua", "release_fast.lua"}, semaphore, weighted)...)
	Refresh  = NewScript(4, "refresh.lua", semaphore...)
	Abort    = NewScript(6, "abort.lua", semaphore...)
	Reclaim  = NewScript(5, "reclaim.lua", semaphore...)
	Delete   = NewScript(5, "delete.lua", semaphore...)
	Status   = NewScript(5, "status.lua")
	Resize   = NewScript(5, "resize.lua", semaphore...)
	Check    = NewScript(5, "check.lua", with(semaphore, []string{"inventory.lua"})...)
	Repair   = NewScript(5, "repair.lua", with(semaphore, []string{"inventory.lua"})...)
	AcquireN = NewScript(8, "acquire_n.lua", with(semaphore, weighted)...)
	AbortN   = NewScript(8, "abort_n.lua", with(semaphore, weighted)...)

	// The read-write lock's.
	RWAcquire = NewScript(6, "rw_acquire.lua", "base.lua", "rw_common.lua")
	RWAbort   = NewScript(6, "rw_abort.lua", "base.lua", "rw_common.lua")
	RWRelease = NewScript(5, "rw_release.lua", "base.lua", "rw_common.lua")
	RWRefresh = NewScript(5, "rw_refresh.lua", "base.lua", "rw_common.lua")

	// The rate gate's (package rate): RateKeys keys for a start, its state
	// keys (RateStateKeys) for the others.
	RateTake   = NewScript(RateKeys, "rate_take.lua", rate...)
	RateAbort  = NewScript(RateKeys, "rate_abort.lua", rate...)
	RateSet    = NewScript(RateStateKeys, "rate_set.lua", rate...)
	RateStatus = NewScript(RateStateKeys, "rate_status.lua", rate...)
)

// The helper files scripts share, in the order they run.
var (
	semaphore = []string{"base.lua", "meta.lua", "idle.lua", "tokens.lua", "sweep.lua"}
	weighted  = []string{"weighted.lua"}
	rate      = []string{"base.lua", "rate_common.lua", "rate_window.lua"}
)

func with(lists ...[]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}
