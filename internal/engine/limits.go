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
	// MaxLimits is the most limits a rate quota may have.
	MaxLimits = 4
	// RateStateKeys is how many keys a rate quota's state takes (meta,
	// holders, queue, waits, and a log per limit); RateKeys adds a waiter's
	// doorbell.
	RateStateKeys = 4 + MaxLimits
	RateKeys      = RateStateKeys + 1
)
