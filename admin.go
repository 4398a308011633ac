package redsem

import (
	"context"

	"github.com/redsem/redsem/internal/engine"
)

// Admin operates on the semaphore called name under a key prefix without
// taking part in it, as etcd's Election reads a leader without campaigning:
// it never acquires, and it needs no size, since every one of its operations
// works on the size stored in Redis. It is what operators' tools (redsem
// status, check, repair, resize, reclaim, delete, top) use. An Admin holds no
// Redis state and is safe for concurrent use.
//
// A Semaphore has the same methods, with the same meaning; use an Admin when
// the size is not known or not yours to state.
type Admin struct {
	s *Semaphore
}

// NewAdmin returns an Admin for the semaphore (or mutex, or weighted
// semaphore) called name under prefix (DefaultPrefix unless the semaphore
// was made with WithPrefix). It checks its arguments and does no I/O: a
// semaphore that does not exist yet reads as such (Status.Exists false).
// Errors: ErrInvalidName, ErrInvalidOption (a nil pool, a bad prefix).
func NewAdmin(pool Pool, prefix, name string) (*Admin, error) {
	if err := engine.CheckPool(pool, "pool"); err != nil {
		return nil, err
	}
	if err := engine.CheckName(name); err != nil {
		return nil, err
	}
	cfg, err := buildConfig([]Option{WithPrefix(prefix)})
	if err != nil {
		return nil, err
	}
	// Size 0: no operation of an Admin sends or checks a size of its own.
	return &Admin{s: &Semaphore{pool: pool, block: pool, name: name, cfg: cfg, k: newKeys(cfg.prefix, name)}}, nil
}

// Name returns the semaphore's name.
func (a *Admin) Name() string { return a.s.name }

// Status reads a snapshot of the semaphore; see Semaphore.Status.
func (a *Admin) Status(ctx context.Context) (Status, error) { return a.s.Status(ctx) }

// Check reads the semaphore's token inventory and writes nothing; see
// Semaphore.Check.
func (a *Admin) Check(ctx context.Context) (Inventory, error) { return a.s.Check(ctx) }

// Repair restores the token inventory; see Semaphore.Repair.
func (a *Admin) Repair(ctx context.Context) (RepairReport, error) { return a.s.Repair(ctx) }

// Resize sets the semaphore's size to n for every client; see
// Semaphore.Resize.
func (a *Admin) Resize(ctx context.Context, n int) error { return a.s.Resize(ctx, n) }

// Reclaim gives back the tokens of expired leases and returns how many; see
// Semaphore.Reclaim.
func (a *Admin) Reclaim(ctx context.Context) (int, error) { return a.s.Reclaim(ctx) }

// Delete removes every key of the semaphore; see Semaphore.Delete.
func (a *Admin) Delete(ctx context.Context) error { return a.s.Delete(ctx) }

// RWStatus reads a snapshot of the read-write lock of the same name and
// prefix (an RWMutex keeps keys of its own, apart from the semaphore's); see
// RWMutex.Status.
func (a *Admin) RWStatus(ctx context.Context) (RWStatus, error) {
	m, err := NewRWMutex(a.s.pool, a.s.name, WithPrefix(a.s.cfg.prefix))
	if err != nil {
		return RWStatus{}, err
	}
	return m.Status(ctx)
}
