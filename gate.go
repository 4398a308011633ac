package redsem

import (
	"context"
	"fmt"
	"time"

	"github.com/redsem/redsem/rate"
)

// Gate combines a Semaphore and a rate gate (package rate): a call passes
// when it holds one
// of the semaphore's slots (at most Size in flight) and has been granted a
// start (at most n starts per interval). Both limits hold across every
// process that uses the same names.
//
// Acquire takes the slot first and the start last, so that the call begins
// right at its grant: a start granted before waiting for a slot would be
// spent while the call could not begin, and delayed starts bunch up at the
// remote side. Hold the slot for the whole call: the lease refreshes itself
// meanwhile (the default); with WithFixedTTL the semaphore's TTL must cover
// the wait for the start as well as the call.
type Gate struct {
	sem  *Semaphore
	rate *rate.Gate
}

// NewGate returns a Gate over sem and the rate gate rg. Neither may be nil.
func NewGate(sem *Semaphore, rg *rate.Gate) (*Gate, error) {
	if sem == nil || rg == nil {
		return nil, fmt.Errorf("%w: NewGate needs a semaphore and a rate gate", ErrInvalidOption)
	}
	return &Gate{sem: sem, rate: rg}, nil
}

// GateLease is a held slot of a Gate's semaphore plus the start that was
// granted with it. Release the slot when the call ends; the start is never
// given back (it returns by itself, per after its grant).
type GateLease struct {
	*Lease
	// Start is the granted start; Start.Waited counts only the wait for it,
	// not the wait for the slot.
	Start rate.Start
}

// Release gives the slot back; see Lease.Release. It is nil-safe.
func (l *GateLease) Release(ctx context.Context) error {
	if l == nil {
		return ErrLeaseLost
	}
	return l.Lease.Release(ctx)
}

// Acquire blocks until a slot is held and a start is granted, or until ctx
// ends. On any error nothing is held: a slot taken before the start failed is
// released, and (as with rate.Gate.Wait) a start granted to a cancelled caller
// is given back.
func (g *Gate) Acquire(ctx context.Context) (*GateLease, error) {
	lease, err := g.sem.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	st, err := g.rate.Wait(ctx)
	if err != nil {
		g.giveBack(ctx, lease)
		return nil, err
	}
	return &GateLease{Lease: lease, Start: st}, nil
}

// TryAcquire returns a GateLease if a slot is free and a start is possible
// now. Otherwise it returns ErrNoToken (no slot) or a *rate.LimitedError
// (rate.ErrRateLimited, with its RetryAfter), and holds nothing. It never
// waits.
func (g *Gate) TryAcquire(ctx context.Context) (*GateLease, error) {
	lease, err := g.sem.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	st, err := g.rate.Allow(ctx)
	if err != nil {
		g.giveBack(ctx, lease)
		return nil, err
	}
	return &GateLease{Lease: lease, Start: st}, nil
}

// giveBack releases a slot after the start failed, even when ctx has ended.
func (g *Gate) giveBack(ctx context.Context, lease *Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = lease.Release(rctx)
}
