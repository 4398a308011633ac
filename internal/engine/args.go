package engine

// The arguments of each declared script, one type each: its fields are the
// names of the script's "-- ARGV:" header, in order (a slice last is its
// "then ..." item, spread). Declared[A].With takes only its script's type,
// so the compiler checks every call, and TestArgTypesMatchHeaders holds
// each type against its header.

// AcquireArgs are acquire.lua's. SizeMode and IdleMs are optional: left
// out while zero, as the header allows.
type AcquireArgs struct {
	Size                     int
	AcqID                    string
	TTLMs                    int64
	Label                    string
	BlockMs, GraceMs, TombMs int64
	Phase                    string
	SizeMode                 string
	IdleMs                   int64
}

// RegisterArgs are register.lua's (Size "": adopt the stored size).
type RegisterArgs struct {
	Size             string
	AcqID            string
	BlockMs, GraceMs int64
}

// ReleaseArgs are release.lua's and rw_release.lua's.
type ReleaseArgs struct {
	Token, AcqID string
	Others       []string
}

// RefreshArgs are refresh.lua's and rw_refresh.lua's.
type RefreshArgs struct {
	Token, AcqID string
	TTLMs        int64
	Others       []string
}

// AbortArgs are abort.lua's.
type AbortArgs struct {
	AcqID, Mode string
	TombMs      int64
}

// ReclaimArgs are reclaim.lua's.
type ReclaimArgs struct{ Limit int }

// ResizeArgs are resize.lua's; IdleMs is optional.
type ResizeArgs struct {
	N      int
	Seed   string
	IdleMs int64
}

// AcquireNArgs are acquire_n.lua's.
type AcquireNArgs struct {
	Size                             int
	AcqID                            string
	K                                int
	TTLMs                            int64
	Label                            string
	BlockMs, GraceMs, TombMs, PollMs int64
	Phase, SizeMode                  string
	IdleMs                           int64
}

// AbortNArgs are abort_n.lua's.
type AbortNArgs struct {
	AcqID  string
	K      int
	Mode   string
	TombMs int64
}

// RWAcquireArgs are rw_acquire.lua's.
type RWAcquireArgs struct {
	AcqID, Mode      string
	TTLMs            int64
	Label            string
	BlockMs, GraceMs int64
	Phase            string
}

// RWAbortArgs are rw_abort.lua's.
type RWAbortArgs struct {
	AcqID, Mode   string
	TombMs, TTLMs int64
}

// ElectionArgs are election.lua's.
type ElectionArgs struct{ Op, AcqID, Value string }

// ObserveArgs are election_observe.lua's.
type ObserveArgs struct {
	ObsID, Epoch     string
	AfterSeq         int64
	BlockMs, GraceMs int64
}

// RateTakeArgs are rate_take.lua's: Each holds n, perUs, units of each of
// the Limits limits.
type RateTakeArgs struct {
	AcqID                    string
	BlockUs, GraceUs, TombUs int64
	Phase                    string
	IdleMs                   int64
	Limits                   int
	Each                     []interface{}
}

// RateAbortArgs are rate_abort.lua's.
type RateAbortArgs struct {
	AcqID, Mode string
	TombUs      int64
}

// RateSetArgs are rate_set.lua's: Each holds n, perUs of each of the
// Limits limits.
type RateSetArgs struct {
	IdleMs int64
	Limits int
	Each   []interface{}
}

// NoArgs are the arguments of a script that takes none.
type NoArgs struct{}
