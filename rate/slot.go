package rate

import (
	"context"
	"time"
)

// Slot is something held that a start is taken for: a *redsem.Lease (a
// semaphore's slot, to cap calls in flight as well as starts) is one.
type Slot interface {
	Release(ctx context.Context) error
}

// WaitHolding is Wait for a caller that holds slot, taken first so that the
// call begins right at its grant (a start granted before waiting for a slot
// would be spent while the call could not begin). When no start is granted
// it releases slot, even after ctx has ended, and returns Wait's error; so
// on any error nothing is held. Hold the slot for the whole call.
func (g *Gate) WaitHolding(ctx context.Context, slot Slot) (Start, error) {
	st, err := g.Wait(ctx)
	if err != nil {
		giveBack(ctx, slot)
	}
	return st, err
}

// AllowHolding is Allow for a caller that holds slot: when no start is
// possible now it releases slot and returns Allow's *LimitedError
// (ErrRateLimited, with its RetryAfter) or other error. It never waits.
func (g *Gate) AllowHolding(ctx context.Context, slot Slot) (Start, error) {
	st, err := g.Allow(ctx)
	if err != nil {
		giveBack(ctx, slot)
	}
	return st, err
}

// giveBack releases a slot after the start failed, even when ctx has ended.
func giveBack(ctx context.Context, slot Slot) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = slot.Release(rctx)
}
