package rate

import (
	"errors"
	"fmt"
	"time"

	"github.com/redsem/redsem/internal/engine"
)

// Sentinel errors. Test for them with errors.Is; the errors returned carry
// more detail. Those a gate shares with a semaphore are the very values
// package redsem exports under the same names, so errors.Is(err,
// redsem.ErrWrongType) holds as well.
var (
	// ErrRateLimited is returned by Allow when no start is possible now; the
	// error is a *LimitedError that says when to try again.
	ErrRateLimited = engine.ErrRateLimited

	// ErrRateMismatch is returned when the n or per a client asked for differ
	// from those stored in Redis by the client that created the gate.
	// Nothing was written. The error is a *MismatchError.
	ErrRateMismatch = errors.New("redsem: rate mismatch")

	// ErrInvalidInterval is returned by New when per is not between 1ms and
	// MaxPer (per <= 0 included), before any I/O.
	ErrInvalidInterval = errors.New("redsem: invalid interval")

	// ErrInvalidName, ErrInvalidSize (n out of range) and ErrInvalidOption
	// are returned by New for bad arguments, before any I/O.
	ErrInvalidName   = engine.ErrInvalidName
	ErrInvalidSize   = engine.ErrInvalidSize
	ErrInvalidOption = engine.ErrInvalidOption

	// ErrWrongType is returned when a key of the gate holds a Redis value of
	// another type (someone else wrote to it). Nothing was written.
	ErrWrongType = engine.ErrWrongType

	// ErrCorrupt is returned when the gate's keys are inconsistent in a way
	// the scripts will not repair on their own (tokens without the meta
	// record, a grant time too large to grow).
	ErrCorrupt = engine.ErrCorrupt

	// ErrOutOfMemory is returned when Redis is at maxmemory under the
	// noeviction policy and refuses the script's writes.
	ErrOutOfMemory = engine.ErrOutOfMemory
)

// LimitedError is Allow's refusal. It matches ErrRateLimited.
type LimitedError struct {
	Name string
	// RetryAfter is how long until another start may be possible.
	RetryAfter time.Duration
}

func (e *LimitedError) Error() string {
	return fmt.Sprintf("redsem: rate gate %q: rate limited, retry after %v", e.Name, e.RetryAfter)
}

// Unwrap lets errors.Is(err, ErrRateLimited) hold.
func (e *LimitedError) Unwrap() error { return ErrRateLimited }

// MismatchError reports the rate a client asked for and the rate stored in
// Redis. It matches ErrRateMismatch.
type MismatchError struct {
	Name      string
	N         int
	Per       time.Duration
	StoredN   int
	StoredPer time.Duration
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("redsem: rate gate %q is %d per %v in Redis, this client asked for %d per %v",
		e.Name, e.StoredN, e.StoredPer, e.N, e.Per)
}

// Unwrap lets errors.Is(err, ErrRateMismatch) hold.
func (e *MismatchError) Unwrap() error { return ErrRateMismatch }
