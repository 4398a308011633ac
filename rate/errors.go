package rate

import (
	"errors"
	"fmt"
	"strings"
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

	// ErrRateMismatch is returned when the limits a client was made with
	// differ from those stored in Redis by the client that created the gate,
	// and no SetRate or SetLimits has written them since (after one, every
	// client follows the stored limits), or when they are not as many.
	// Nothing was written. The error is a *MismatchError.
	ErrRateMismatch = errors.New("redsem: rate mismatch")

	// ErrTooLarge is returned by WaitN and AllowN when a start asks for more
	// units of a limit than its n in force: no window could ever admit it.
	// It is returned at once, without waiting, and to a waiter whose request
	// a lowered rate (SetRate, SetLimits) made too large. Nothing is held.
	// The error is a *TooLargeError.
	ErrTooLarge = errors.New("redsem: more units than the rate admits")

	// ErrInvalidInterval is returned by New when per is not between 1ms and
	// MaxPer (per <= 0 included), before any I/O.
	ErrInvalidInterval = errors.New("redsem: invalid interval")

	// ErrInvalidName, ErrInvalidSize (n, a unit count or the number of
	// limits out of range) and ErrInvalidOption are returned for bad
	// arguments, before any I/O.
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

// MismatchError reports the limits a client was made with and the limits
// stored in Redis (one each for a Gate). It matches ErrRateMismatch.
type MismatchError struct {
	Name   string
	Want   []Limit
	Stored []Limit
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("redsem: rate gate %q is %s in Redis, this client asked for %s",
		e.Name, limitsString(e.Stored), limitsString(e.Want))
}

// Unwrap lets errors.Is(err, ErrRateMismatch) hold.
func (e *MismatchError) Unwrap() error { return ErrRateMismatch }

func limitsString(ls []Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.String()
	}
	return strings.Join(parts, " and ")
}

// TooLargeError reports a start that asked for more units of a limit than
// its n in force. It matches ErrTooLarge.
type TooLargeError struct {
	Name string
	// Index is the limit's position among the quota's limits (0 for a Gate).
	Index int
	// Units is what the start asked of that limit.
	Units int
	// Limit is that limit as stored in Redis.
	Limit Limit
}

func (e *TooLargeError) Error() string {
	which := ""
	if e.Index > 0 {
		which = fmt.Sprintf(" (its limit #%d)", e.Index+1)
	}
	return fmt.Sprintf("redsem: rate gate %q: a start of %d units can never pass its limit of %v%s",
		e.Name, e.Units, e.Limit, which)
}

// Unwrap lets errors.Is(err, ErrTooLarge) hold.
func (e *TooLargeError) Unwrap() error { return ErrTooLarge }
