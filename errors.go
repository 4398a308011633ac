package redsem

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Sentinel errors. Test for them with errors.Is; the errors returned carry
// more detail (the semaphore's name, the key, the stored size).
var (
	// ErrNoToken is returned by TryAcquire and TryLock when no token is free.
	ErrNoToken = errors.New("redsem: no token free")

	// ErrLeaseLost is returned by Release and Refresh when Redis no longer
	// records the lease: it expired and its token was reclaimed (and maybe
	// handed to another holder), the semaphore was deleted, or Redis lost its
	// data. Nothing was written. Methods of a nil *Lease return it too.
	ErrLeaseLost = errors.New("redsem: lease lost")

	// ErrLeaseExpired is the cause reported by Lease.Err once the lease's
	// local deadline has passed without a refresh, and is returned by Refresh
	// from then on. Release may still succeed if the token was not reclaimed.
	ErrLeaseExpired = errors.New("redsem: lease expired")

	// ErrReleased is returned by Release and Refresh on a lease that was
	// already released through this handle, and is the cause reported by
	// Lease.Err after a successful Release.
	ErrReleased = errors.New("redsem: lease already released")

	// ErrSizeMismatch is returned when the size a client asked for differs
	// from the size stored in Redis by the client that created the semaphore.
	// Nothing was written: the semaphore keeps its stored size.
	ErrSizeMismatch = errors.New("redsem: size mismatch")

	// ErrWrongType is returned when a key of the semaphore holds a Redis value
	// of another type (someone else wrote to it). Nothing was written.
	ErrWrongType = errors.New("redsem: key holds the wrong type")

	// ErrCorrupt is returned when the semaphore's keys are inconsistent in a
	// way redsem will not repair on its own, for example tokens or leases
	// without the meta record that says how many tokens there should be.
	ErrCorrupt = errors.New("redsem: semaphore state is corrupt")

	// ErrOutOfMemory is returned by Acquire and TryAcquire when Redis is at
	// maxmemory under the noeviction policy and refuses new acquisitions.
	// Release and Refresh still work then (their first write frees memory).
	ErrOutOfMemory = errors.New("redsem: redis is out of memory")

	// ErrInvalidName, ErrInvalidSize, ErrInvalidTTL and ErrInvalidOption are
	// returned by the constructors for bad arguments, before any I/O.
	ErrInvalidName   = errors.New("redsem: invalid name")
	ErrInvalidSize   = errors.New("redsem: invalid size")
	ErrInvalidTTL    = errors.New("redsem: invalid ttl")
	ErrInvalidOption = errors.New("redsem: invalid option")
)

// SizeMismatchError reports the size a client asked for and the size stored
// in Redis. It matches ErrSizeMismatch with errors.Is.
type SizeMismatchError struct {
	Name   string
	Want   int
	Stored int
}

func (e *SizeMismatchError) Error() string {
	return fmt.Sprintf("redsem: semaphore %q has size %d in Redis, this client asked for %d", e.Name, e.Stored, e.Want)
}

// Unwrap lets errors.Is(err, ErrSizeMismatch) hold.
func (e *SizeMismatchError) Unwrap() error { return ErrSizeMismatch }

// Rate gate errors. Test for them with errors.Is.
var (
	// ErrRateLimited is returned by Allow when no start is possible now; the
	// error is a *RateLimitedError that says when to try again.
	ErrRateLimited = errors.New("redsem: rate limited")

	// ErrInvalidInterval is returned by NewRateGate when per is not between
	// 1ms and MaxTTL (per <= 0 included), before any I/O.
	ErrInvalidInterval = errors.New("redsem: invalid interval")

	// ErrRateMismatch is returned when the n or per a client asked for differ
	// from those stored in Redis by the client that created the gate.
	// Nothing was written. The error is a *RateMismatchError.
	ErrRateMismatch = errors.New("redsem: rate mismatch")
)

// RateLimitedError is Allow's refusal. It matches ErrRateLimited.
type RateLimitedError struct {
	Name string
	// RetryAfter is how long until another start may be possible.
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("redsem: rate gate %q: rate limited, retry after %v", e.Name, e.RetryAfter)
}

// Unwrap lets errors.Is(err, ErrRateLimited) hold.
func (e *RateLimitedError) Unwrap() error { return ErrRateLimited }

// RateMismatchError reports the rate a client asked for and the rate stored
// in Redis. It matches ErrRateMismatch.
type RateMismatchError struct {
	Name      string
	N         int
	Per       time.Duration
	StoredN   int
	StoredPer time.Duration
}

func (e *RateMismatchError) Error() string {
	return fmt.Sprintf("redsem: rate gate %q is %d per %v in Redis, this client asked for %d per %v",
		e.Name, e.StoredN, e.StoredPer, e.N, e.Per)
}

// Unwrap lets errors.Is(err, ErrRateMismatch) hold.
func (e *RateMismatchError) Unwrap() error { return ErrRateMismatch }

func (s *Semaphore) scriptError(op string, err error) error {
	return scriptError(op, "semaphore", s.name, s.size, err)
}

// scriptError turns the error replies of the scripts and of Redis itself into
// the package's sentinels; other errors pass through, wrapped. kind and name
// say whose scripts ran ("semaphore", "rate gate"); size is the size the
// client asked for.
func scriptError(op, kind, name string, size int, err error) error {
	var re redis.Error
	if !errors.As(err, &re) {
		return fmt.Errorf("redsem: %s %s %q: %w", op, kind, printable(name), err)
	}
	msg := string(re)
	switch {
	case strings.HasPrefix(msg, "REDSEM_SIZE "):
		stored, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(msg, "REDSEM_SIZE ")))
		return &SizeMismatchError{Name: name, Want: size, Stored: stored}
	case strings.HasPrefix(msg, "REDSEM_WRONGTYPE "):
		return fmt.Errorf("%w: %s", ErrWrongType, strings.TrimPrefix(msg, "REDSEM_WRONGTYPE "))
	case strings.Contains(msg, "WRONGTYPE"):
		return fmt.Errorf("%w: %s %q: %s", ErrWrongType, kind, printable(name), msg)
	case strings.HasPrefix(msg, "OOM "):
		return fmt.Errorf("%w: %s %q: %s", ErrOutOfMemory, kind, printable(name), msg)
	case strings.HasPrefix(msg, "REDSEM_CORRUPT "):
		return fmt.Errorf("%w: %s", ErrCorrupt, strings.TrimPrefix(msg, "REDSEM_CORRUPT "))
	}
	return fmt.Errorf("redsem: %s %s %q: %w", op, kind, printable(name), err)
}

// isRedisError reports whether err is an error reply from Redis (the
// connection is fine) rather than a network or context error.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}
