package admin

import (
	"context"
	"fmt"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Pool is where the functions of this package get their Redis connections;
// it has redsem.Pool's method set, so any redsem.Pool (a *redis.Pool, a
// cluster.Pool, a goredis.Pool) serves.
type Pool interface {
	GetContext(ctx context.Context) (redis.Conn, error)
}

// Handle operates on the semaphore (or mutex, or weighted semaphore) and
// the read-write lock called name under a key prefix, without taking part
// in them: it never acquires, and it needs no size, since every operation
// works on the size stored in Redis. It holds no Redis state and is safe
// for concurrent use.
type Handle struct {
	pool   Pool
	name   string
	prefix string
	base   string // <prefix>{<encoded name>}:
}

// New returns a Handle for name under prefix (redsem.DefaultPrefix unless
// the semaphore was made with WithPrefix). It checks its arguments and does
// no I/O: a name that does not exist yet reads as such (Status.Exists false).
// Errors: ErrInvalidName, ErrInvalidOption (a nil pool, a bad prefix).
func New(pool Pool, prefix, name string) (*Handle, error) {
	if err := engine.CheckPool(pool, "pool"); err != nil {
		return nil, err
	}
	if err := engine.CheckName(name); err != nil {
		return nil, err
	}
	if err := engine.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	return &Handle{pool: pool, name: name, prefix: prefix, base: engine.KeyBase(prefix, name)}, nil
}

// Name returns the name the Handle was made for.
func (h *Handle) Name() string { return h.name }

// keys are the five keys every semaphore script takes, in its order.
func (h *Handle) keys() []interface{} {
	b := h.base
	return []interface{}{b + "meta", b + "tokens", b + "leases", b + "holders", b + "waits"}
}

// call runs r through the pool (engine.Call: once more on a fresh
// connection when a pooled one is dead) and maps its error replies.
func (h *Handle) call(ctx context.Context, op string, r engine.Run) (interface{}, error) {
	v, _, err := engine.Call(ctx, h.pool, r)
	if err != nil {
		return nil, engine.ScriptError(op, "semaphore", h.name, err)
	}
	return v, nil
}

// Resize sets the semaphore's size in Redis to n, atomically, for every
// client at once; a semaphore that does not exist yet is created with size
// n. Growing mints the new slots' tokens at once (blocked waiters are served
// right away); shrinking retires the tokens above n and withholds as many
// valid tokens as retired leases are still out, so the holders drain down to
// n (Status.Withheld). Clients of another size then get ErrSizeMismatch
// unless made WithAdoptSize. Errors: ErrInvalidSize (n not between 1 and
// redsem.MaxSize, before any I/O), ErrWrongType, ErrCorrupt, or a
// connection error. Calling it again after a connection error is safe.
func (h *Handle) Resize(ctx context.Context, n int) error {
	if n < 1 || n > engine.MaxSize {
		return fmt.Errorf("%w: %d is not between 1 and %d", engine.ErrInvalidSize, n, engine.MaxSize)
	}
	_, err := h.call(ctx, "resize", engine.Resize.With(h.keys(),
		engine.ResizeArgs{N: n, Seed: engine.NewAcqID()}))
	return err
}

// Reclaim gives back the tokens of every expired lease and of pending lists
// whose waiter never confirmed, and returns how many it put back. Every
// Acquire does the same, and blocked waiters wake for it at the earliest
// lease deadline, so calling Reclaim is never required.
func (h *Handle) Reclaim(ctx context.Context) (int, error) {
	return redis.Int(h.call(ctx, "reclaim", engine.Reclaim.With(h.keys(), engine.ReclaimArgs{Limit: 1000})))
}

// Delete removes every kind that lives under the name, in one atomic
// script: the semaphore (or mutex), the read-write lock, the rate gate and
// the election, with the keys of their acquisitions in flight and an
// election's observers. Holders find out on their next Refresh or Release
// (ErrLeaseLost), a leader at its next refresh (its leadership's context
// ends), observers at their next read (the leader of the election made
// afresh, or nobody); the next acquisition or start creates the name afresh
// (a semaphore with a new epoch, so no token of the old one is ever
// accepted; a gate with an empty window). Blocked waiters keep waiting and
// are served by what the next acquisition creates. A key
// of another type than its layout's (written by someone else) makes it fail
// with ErrWrongType and delete nothing: Purge removes such a name. Calling
// it again after a connection error is safe.
func (h *Handle) Delete(ctx context.Context) error {
	_, err := h.runKeys(ctx, "delete", "delete")
	return err
}
