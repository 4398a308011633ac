package redsem

import (
	"context"
	"fmt"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/engine"
)

// The operators' functions live in package admin (admin.Handle). The tests
// of this package, explore_*_test.go among them, call them on a Semaphore or
// an RWMutex through these test-only methods, which open a Handle on the
// same pool, prefix and name; they are not part of the API.

// handle is an admin.Handle for s's name under s's prefix.
func (s *Semaphore) handle() *admin.Handle {
	h, err := admin.New(s.pool, s.cfg.prefix, s.name)
	if err != nil {
		panic(err) // s was made from the same name and prefix
	}
	return h
}

func (s *Semaphore) Status(ctx context.Context) (admin.Status, error) { return s.handle().Status(ctx) }

func (s *Semaphore) Check(ctx context.Context) (admin.Inventory, error) { return s.handle().Check(ctx) }

func (s *Semaphore) Repair(ctx context.Context) (admin.RepairReport, error) {
	return s.handle().Repair(ctx)
}

// Resize is admin.Handle.Resize but for one thing a Handle cannot know: a
// resize that creates the semaphore stores this client's idle expiry
// (WithIdleExpiry), as Semaphore.Resize did before it moved. The explorer
// (explore_world_test.go) models its clients' resizes so.
func (s *Semaphore) Resize(ctx context.Context, n int) error {
	if s.cfg.idle == 0 {
		return s.handle().Resize(ctx, n)
	}
	if n < 1 || n > MaxSize {
		return fmt.Errorf("%w: %d is not between 1 and %d", ErrInvalidSize, n, MaxSize)
	}
	if _, _, err := engine.Call(ctx, s.pool, engine.Resize.With(s.k.all(5),
		engine.ResizeArgs{N: n, Seed: engine.NewAcqID(), IdleMs: s.cfg.idle.Milliseconds()})); err != nil {
		return s.scriptError("resize", err)
	}
	return nil
}

func (s *Semaphore) Reclaim(ctx context.Context) (int, error) { return s.handle().Reclaim(ctx) }

func (s *Semaphore) Delete(ctx context.Context) error { return s.handle().Delete(ctx) }

func (m *RWMutex) Status(ctx context.Context) (admin.RWStatus, error) {
	return m.s.handle().RWStatus(ctx)
}

// ErrRepairUnsafe and MinIdleExpiry are admin.ErrRepairUnsafe and the
// unexported limit, under the names the tests use.
var ErrRepairUnsafe = admin.ErrRepairUnsafe

const MinIdleExpiry = minIdleExpiry
