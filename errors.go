package redsem

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Sentinel errors. Test for them with errors.Is; the errors returned carry
// more detail (the semaphore's name, the key, the stored size).
var (
	// ErrLeaseLost is returned by Release and Refresh when Redis no longer
	// records the lease: it expired and its token was reclaimed (and maybe
	// handed to another holder), the semaphore was deleted, or Redis lost its
	// data. Nothing was written. Methods of a nil *Lease return it too.
	ErrLeaseLost = errors.New("redsem: lease lost")

	// ErrLeaseExpired is the cause reported by Lease.Err once the lease's
	// local deadline has passed without a refresh, and is returned by Refresh
	// from then on. Release may still succeed if the token was not reclaimed.
	// When refreshes failed before (Redis unreachable), the cause matches the
	// last refresh's error too.
	ErrLeaseExpired = errors.New("redsem: lease expired")

	// ErrReleased is returned by Release and Refresh on a lease that was
	// already released through this handle, and is the cause reported by
	// Lease.Err after a successful Release.
	ErrReleased = errors.New("redsem: lease already released")

	// ErrNoToken is returned when a try finds nothing free: by TryAcquire and
	// TryAcquireN (no token, or not k of them), Mutex.TryLock (the mutex is
	// held), and RWMutex.TryRLock and TryLock (the lock is held on the other
	// side, or by a writer, or others queue before this caller).
	ErrNoToken = engine.ErrNoToken

	// ErrSizeMismatch is returned when the size a client asked for differs
	// from the size stored in Redis by the client that created the semaphore.
	// Nothing was written: the semaphore keeps its stored size.
	ErrSizeMismatch = errors.New("redsem: size mismatch")

	// ErrWrongType is returned when a key of the semaphore holds a Redis value
	// of another type (someone else wrote to it), or when clients of redsem
	// before protocol v2 use the name (CHANGELOG: how to deploy across the
	// change). Nothing was written.
	ErrWrongType = engine.ErrWrongType

	// ErrCorrupt is returned when the semaphore's keys are inconsistent in a
	// way redsem will not repair on its own, for example tokens or leases
	// without the meta record that says how many tokens there should be.
	ErrCorrupt = engine.ErrCorrupt

	// ErrOutOfMemory is returned by Acquire and TryAcquire when Redis is at
	// maxmemory under the noeviction policy and refuses new acquisitions.
	// Release and Refresh still work then (their first write frees memory).
	ErrOutOfMemory = engine.ErrOutOfMemory

	// ErrStaleGrant is returned by Acquire and TryAcquire when several grants
	// in a row (3) reached this process only after their lease's
	// local deadline: the TTL is too short for the round trip to Redis, or
	// the process keeps being stalled. Each such token was given back.
	ErrStaleGrant = engine.ErrStaleGrant

	// ErrInvalidName, ErrInvalidSize, ErrInvalidTTL and ErrInvalidOption are
	// returned by the constructors for bad arguments, before any I/O.
	ErrInvalidName   = engine.ErrInvalidName
	ErrInvalidSize   = engine.ErrInvalidSize
	ErrInvalidTTL    = errors.New("redsem: invalid ttl")
	ErrInvalidOption = engine.ErrInvalidOption
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

func (s *Semaphore) scriptError(op string, err error) error {
	return scriptError(op, s.leaseKind().what, s.name, s.size, err)
}

// scriptError turns the error replies of the scripts and of Redis itself into
// the package's sentinels; other errors pass through, wrapped. kind and name
// say whose scripts ran; size is the size the client asked for.
func scriptError(op, kind, name string, size int, err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(string(re), "REDSEM_SIZE ") {
		stored, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(string(re), "REDSEM_SIZE ")))
		return &SizeMismatchError{Name: name, Want: size, Stored: stored}
	}
	return engine.ScriptError(op, kind, name, err)
}
