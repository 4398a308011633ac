package redsem

import (
	"context"
	"fmt"

	"github.com/redsem/redsem/internal/engine"
)

// Resize sets the size of the semaphore in Redis to n, atomically, for every
// client at once: the size stored in Redis is the only one in force. n must
// be between 1 and MaxSize (ErrInvalidSize, before any I/O). A semaphore
// that does not exist yet is created with size n.
//
// Growing mints the tokens of the new slots and pushes them at once, so
// blocked waiters are served right away. A token of a new slot that is still
// leased or in flight to a waiter (retired by an earlier shrink and not yet
// given back) is not minted again: it comes back, valid, when its holder
// gives it back.
//
// Shrinking retires the tokens above n at once: the free ones leave the list
// now, and no retired token is granted again. Holders of retired tokens keep
// their leases until they release them or the leases expire, and their
// tokens are then dropped instead of given back. Until then, as many valid
// tokens as there are retired leases still out are withheld from the list
// (Status.Withheld, Inventory.Withheld): a shrink never grants anything
// while more than n hold, so the holders drain down to n and stay at or
// below it. Each retired lease that ends lets one withheld token go back.
//
// Afterwards Acquire and TryAcquire of a client made with another size fail
// with a *SizeMismatchError (ErrSizeMismatch), this Semaphore included,
// unless it was made WithAdoptSize; make a new Semaphore of size n, or use
// WithAdoptSize for clients that should follow. Status and Check report the
// new size. Resize to the current size changes nothing; calling it again
// after a connection error is safe.
func (s *Semaphore) Resize(ctx context.Context, n int) error {
	if n < 1 || n > MaxSize {
		return fmt.Errorf("%w: %d is not between 1 and %d", ErrInvalidSize, n, MaxSize)
	}
	if _, _, err := engine.Call(ctx, s.pool, engine.Resize, engine.Args(engine.Resize, s.k.all(5),
		engine.A("n", n), engine.A("seed", engine.NewAcqID()), engine.A("idleMs", s.cfg.idle.Milliseconds()))...); err != nil {
		return s.scriptError("resize", err)
	}
	return nil
}

// sizeMode is acquire.lua's last argument: "adopt" makes it take the size
// stored in Redis (WithAdoptSize).
func (s *Semaphore) sizeMode() string {
	if s.cfg.adoptSize {
		return "adopt"
	}
	return "fixed"
}
