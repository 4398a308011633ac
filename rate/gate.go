package rate

import (
	"context"
	"time"
)

// Gate admits at most n units in any window of length per, across every
// process that uses the same name, prefix and Redis: "at most 100 calls per
// second to the partner API". Wait and Allow take one unit, WaitN and
// AllowN several at once. A Gate is a Quota of one limit (NewQuota has
// several), with the same guarantee, fairness and rate rules; it holds no
// Redis state of its own and is safe for concurrent use. Create one per
// name and share it.
//
// Each granted start is logged in Redis with its grant time (Redis TIME)
// and its units; it counts against the window until Redis time reaches its
// grant time plus per, and then leaves it by itself. A start is never given
// back early, so a client that crashes right after its grant loses nothing:
// its units come back per after they were taken, as everyone's do.
//
// Waiters queue in Redis, first come, first served, and sleep in BLPOP on a
// doorbell of their own; units that come back are granted to the oldest
// waiter by whichever script sees them first, and its doorbell is rung. The
// oldest waiter keeps time for the queue: it wakes when its request fits
// (on a local timer for the last 250ms, because Redis fires blocking
// timeouts only on its cron tick, every 100ms at the default hz) and takes
// it, then rings the next waiter, which keeps time in its turn. No client
// polls and no daemon runs.
//
// The guarantee is on grant times, by Redis TIME (Start.At). A call begins
// when its Wait returns, later than its grant by the reply's trip and the
// caller's scheduling; if those delays vary by up to d, the calls' own start
// times keep at most n units in any window of length per-d. Configure a
// little below the external quota (e.g. 95 per second for 100) when the
// remote side counts strictly.
//
// The package documentation lists the keys.
type Gate struct {
	q *Quota
}

// Start reports a start granted by Wait or Allow, or, with a refused Allow,
// when to try again.
type Start struct {
	// At is the Redis TIME of the grant. Grant times of a gate strictly
	// increase, and no window of length per holds more than n units of
	// them. For a refused Allow it is zero.
	At time.Time
	// Waited is how long the call took, from entry to the grant, on this
	// process's monotonic clock (one round trip when nothing was waited).
	Waited time.Duration
	// RetryAfter is how long from the reply until another start of the same
	// units may be possible: 0 while they fit and nobody queues, else until
	// enough units leave the window. Waiting callers are served first, so
	// while anyone waits it is a lower bound. For a refused Allow it is the
	// Retry-After to report.
	RetryAfter time.Duration
}

// New returns the gate called name that admits n units per interval per.
// It checks its arguments and does no I/O: the first start by any client
// creates the gate in Redis. n must be between 1 and MaxN
// (ErrInvalidSize), per between 1ms and MaxPer (ErrInvalidInterval).
//
// The rate in force is the one stored in Redis: until SetRate has written
// it, a client whose n or per differ gets a *MismatchError
// (ErrRateMismatch) and nothing changes; after, every client follows the
// stored rate (see NewQuota).
//
// name may hold any bytes (it is encoded before it goes into a key); it must
// not be empty or longer than MaxNameLen (ErrInvalidName). The options are
// this package's (see options.go); an invalid one is refused with
// ErrInvalidOption.
func New(pool Pool, name string, n int, per time.Duration, opts ...Option) (*Gate, error) {
	q, err := NewQuota(pool, name, []Limit{{N: n, Per: per}}, opts...)
	if err != nil {
		return nil, err
	}
	return &Gate{q: q}, nil
}

// Name returns the gate's name as given to New.
func (g *Gate) Name() string { return g.q.name }

// Limit returns the n and per this client was made with: at most n units
// in any window of length per. They create the gate; the rate in force is
// the one stored in Redis (Status).
func (g *Gate) Limit() (n int, per time.Duration) { return g.q.limits[0].N, g.q.limits[0].Per }

// Wait is WaitN(ctx, 1).
func (g *Gate) Wait(ctx context.Context) (Start, error) { return g.q.WaitN(ctx, 1) }

// Allow is AllowN(ctx, 1).
func (g *Gate) Allow(ctx context.Context) (Start, error) { return g.q.AllowN(ctx, 1) }

// WaitN blocks until a start of n units is allowed and returns it, or until
// ctx ends: n units of the window at once, or none. Waiters are served in
// the order they started waiting, and a large request at the head is not
// overtaken by smaller ones behind it. An uncontended WaitN is one round
// trip.
//
// n must be between 1 and MaxN (ErrInvalidSize, before any I/O). An n above
// the rate's n in force can never be admitted: WaitN fails at once with a
// *TooLargeError (ErrTooLarge), and so does a waiter when SetRate lowers n
// below its request.
//
// When ctx ends first, WaitN returns an error for which errors.Is(err,
// ctx.Err()) holds, and the gate loses nothing: a start Redis granted in the
// meantime, which this caller never learnt of, is given back at once. Other
// errors: *MismatchError, ErrWrongType, ErrCorrupt, or a connection error.
func (g *Gate) WaitN(ctx context.Context, n int) (Start, error) { return g.q.WaitN(ctx, n) }

// AllowN returns a start of n units if one is possible now, and a
// *LimitedError (ErrRateLimited) if not; the Start it returns then carries
// the same RetryAfter: exact for n units while nobody queues, a lower bound
// while others wait. It never waits, never jumps ahead of waiting callers,
// and is one round trip. n and the other errors are WaitN's.
func (g *Gate) AllowN(ctx context.Context, n int) (Start, error) { return g.q.AllowN(ctx, n) }

// SetRate changes the gate to n units per interval per, in Redis,
// atomically, for every client at once: from the change's Redis time on
// every start is held to it, and every client follows the stored rate,
// whatever it was made with. Waiters are re-timed at once. n and per are
// checked as for New; the rule across a change, and what happens to
// waiters, are those of Quota.SetLimits.
func (g *Gate) SetRate(ctx context.Context, n int, per time.Duration) error {
	return g.q.SetLimits(ctx, Limit{N: n, Per: per})
}

// Status reads a snapshot of the gate. It reports the rate stored in Redis,
// whatever rate this Gate was made with, and writes nothing. Errors:
// ErrWrongType, or a connection error.
func (g *Gate) Status(ctx context.Context) (Status, error) { return g.q.Status(ctx) }
