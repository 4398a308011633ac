package engine

import "time"

// Limits shared by semaphores and rate gates.
const (
	// DefaultPrefix starts every key unless the caller sets another.
	DefaultPrefix = "redsem:"
	// MaxSize is the most tokens a semaphore, or starts per interval a rate
	// gate, may have.
	MaxSize = 10000
	// MaxNameLen is the longest name, in bytes, before encoding.
	MaxNameLen = 512
	// MaxPrefixLen is the longest key prefix, in bytes.
	MaxPrefixLen = 128
	// MaxTTL is the longest lease TTL, and the longest rate interval.
	MaxTTL = 7 * 24 * time.Hour
	// MaxBlock caps one blocking wait; a wait that long starts over. The
	// connection's read timeout should be 0 or above MaxBlock+BlockSlack.
	MaxBlock = 30 * time.Second
	// BlockSlack is how long past a blocking command's own timeout the
	// client waits for its reply.
	BlockSlack = 2 * time.Second
	// MinBlock is the shortest blocking wait.
	MinBlock = 10 * time.Millisecond
	// MaxBrokenWaits bounds how many times in a row a wait starts over after
	// its blocked connection broke before it gives up and returns the error.
	MaxBrokenWaits = 5
	// MaxStaleGrants bounds how many grants in a row an acquisition gives
	// back because they reached it after their lease's local deadline.
	MaxStaleGrants = 3
	// SettleTimeout bounds settling an acquisition or a rate gate's wait by
	// its id after its reply was lost or its context ended.
	SettleTimeout = 5 * time.Second
	// SettleWait is how long a cancelled wait of any kind (Acquire,
	// AcquireN, a rate gate's Wait) waits for that settling before it
	// returns; the settling goes on in the background, within SettleTimeout.
	SettleWait = 250 * time.Millisecond
	// MaxLimits is the most limits a rate quota may have.
	MaxLimits = 4
	// RateStateKeys is how many keys a rate quota's state takes (meta,
	// holders, queue, waits, and a log per limit); RateKeys adds a waiter's
	// doorbell.
	RateStateKeys = 4 + MaxLimits
	RateKeys      = RateStateKeys + 1
)
