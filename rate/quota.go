package rate

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Limit is at most N units in any window of length Per. A unit is whatever
// a start is charged: one call, one token of a language model, one page of
// results.
type Limit struct {
	N   int
	Per time.Duration
}

// String writes l for people: "100 per 1m", "5 per 1m30s" (Go's duration
// without its trailing zero units).
func (l Limit) String() string {
	per := l.Per.String()
	if strings.HasSuffix(per, "m0s") {
		per = strings.TrimSuffix(per, "0s")
	}
	if strings.HasSuffix(per, "h0m") {
		per = strings.TrimSuffix(per, "0m")
	}
	return fmt.Sprintf("%d per %s", l.N, per)
}

// Quota is several limits that every start is held to at once, across every
// process that uses the same name, prefix and Redis: "500 requests and
// 200,000 tokens per minute". A start takes some units of each limit (one
// request and 1,200 tokens), all at once or none. A Gate is a Quota of one
// limit. A Quota holds no Redis state of its own and is safe for concurrent
// use; create one per name and share it.
//
// # Naming
//
// The name names the whole quota: its limits are its own, told apart by
// their position, and all its keys share the name's hash tag, so a start
// that takes from several limits is one script on one Redis Cluster slot.
// Every client of a quota passes its limits in the same order (a client
// whose limits differ is refused, see NewQuota).
//
// # Guarantee
//
// For every start, at its grant time t (Redis TIME, Start.At) and for each
// limit with the rate (n, per) in force at t: the units of the starts
// granted in the window (t-per, t], this one included, are at most n. With
// a rate that never changes, that is: no window of length per holds more
// than n units. Across a change (SetLimits) the rule holds as stated, with
// one exception the documentation of SetLimits gives.
//
// # Fairness
//
// Waiters are served first come, first served, the rule of
// golang.org/x/sync/semaphore: a large request at the head of the queue is
// not overtaken by later, smaller ones, so large requests are not starved.
// AllowN never takes units while anyone waits. One queue serves all the
// limits of a quota.
type Quota struct {
	pool   Pool
	block  Pool
	name   string
	limits []Limit
	cfg    config
	k      keys
	// maxBlock caps one blocking wait (ns). It starts at engine.MaxBlock and
	// shrinks when the connection's read timeout turns out to be shorter.
	maxBlock atomic.Int64
}

// NewQuota returns the quota called name with the given limits, one to
// MaxLimits of them, each between 1 and MaxN units (ErrInvalidSize) per an
// interval between 1ms and MaxPer (ErrInvalidInterval). It does no I/O: the
// first start by any client creates the quota in Redis with that client's
// limits.
//
// The rate in force is the one stored in Redis. Until SetLimits (or
// SetRate) has written it, a client whose limits differ from the stored
// ones gets a *MismatchError (ErrRateMismatch) and nothing changes: two
// configurations that disagree are a mistake to report. Once SetLimits has
// written it, every client follows the stored limits, whatever its own, so
// that a change reaches running clients without a restart; Limits still
// returns the client's own. A client with another number of limits is
// always refused.
//
// name may hold any bytes (it is encoded before it goes into a key); it must
// not be empty or longer than MaxNameLen (ErrInvalidName). The options are
// this package's (see options.go); an invalid one is refused with
// ErrInvalidOption.
func NewQuota(pool Pool, name string, limits []Limit, opts ...Option) (*Quota, error) {
	if err := engine.CheckPool(pool, "pool"); err != nil {
		return nil, err
	}
	if err := engine.CheckName(name); err != nil {
		return nil, err
	}
	if err := checkLimits(name, limits); err != nil {
		return nil, err
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	q := &Quota{pool: pool, block: pool, name: name, limits: append([]Limit(nil), limits...),
		cfg: cfg, k: newKeys(cfg.prefix, name)}
	if cfg.blockPool != nil {
		q.block = cfg.blockPool
	}
	q.maxBlock.Store(int64(engine.MaxBlock))
	return q, nil
}

// checkLimits validates limits for the quota called name, before any I/O.
func checkLimits(name string, limits []Limit) error {
	if len(limits) < 1 || len(limits) > MaxLimits {
		return fmt.Errorf("%w: rate gate %q: %d limits is not between 1 and %d", ErrInvalidSize, engine.Printable(name), len(limits), MaxLimits)
	}
	for _, l := range limits {
		if l.N < 1 || l.N > MaxN {
			return fmt.Errorf("%w: rate gate %q: %d units per interval is not between 1 and %d", ErrInvalidSize, engine.Printable(name), l.N, MaxN)
		}
		if l.Per < time.Millisecond || l.Per > MaxPer {
			return fmt.Errorf("%w: rate gate %q: interval %v is not between 1ms and %v", ErrInvalidInterval, engine.Printable(name), l.Per, MaxPer)
		}
	}
	return nil
}

// Name returns the quota's name as given to NewQuota.
func (q *Quota) Name() string { return q.name }

// Limits returns the limits this client was made with. They create the
// quota; the limits in force are those stored in Redis (Status).
func (q *Quota) Limits() []Limit { return append([]Limit(nil), q.limits...) }

// WaitN blocks until a start taking units[i] of limit i, for every limit at
// once, is allowed and returns it, or until ctx ends. It is all or nothing:
// a start takes from every limit or from none. Waiters are served in the
// order they started waiting (see Fairness) and sleep in Redis rather than
// poll. An uncontended WaitN is one round trip.
//
// units holds one count per limit, in the order of the limits; a count may
// be 0 (nothing of that limit) but not all of them, and none may be negative
// or above MaxN (ErrInvalidSize, before any I/O). A count above its limit's
// n in force can never be admitted: WaitN fails at once with a
// *TooLargeError (ErrTooLarge), and so does a waiter when SetLimits lowers n
// below its count.
//
// When ctx ends first, WaitN returns an error for which errors.Is(err,
// ctx.Err()) holds, and the quota loses nothing: a start Redis granted in
// the meantime, which this caller never learnt of, is given back at once.
// Other errors: *MismatchError, ErrWrongType, ErrCorrupt, or a connection
// error.
func (q *Quota) WaitN(ctx context.Context, units ...int) (Start, error) {
	w := q.watch(ctx)
	st, err := q.take(ctx, units, true)
	return q.observeTake(w, st, err)
}

// AllowN returns a start taking units[i] of limit i if one is possible now,
// and a *LimitedError (ErrRateLimited) if not; the Start it returns then
// carries the same RetryAfter, exact for these units while nobody queues.
// It never waits, never jumps ahead of waiting callers, and is one round
// trip. The units and the other errors are WaitN's.
func (q *Quota) AllowN(ctx context.Context, units ...int) (Start, error) {
	w := q.watch(ctx)
	st, err := q.take(ctx, units, false)
	return q.observeTake(w, st, err)
}

// checkUnits validates the units of one start, before any I/O.
func (q *Quota) checkUnits(units []int) error {
	if len(units) != len(q.limits) {
		return fmt.Errorf("%w: rate gate %q: %d unit counts for %d limits", ErrInvalidSize, engine.Printable(q.name), len(units), len(q.limits))
	}
	total := 0
	for _, u := range units {
		if u < 0 || u > MaxN {
			return fmt.Errorf("%w: rate gate %q: %d units is not between 0 and %d", ErrInvalidSize, engine.Printable(q.name), u, MaxN)
		}
		total += u
	}
	if total == 0 {
		return fmt.Errorf("%w: rate gate %q: a start must take at least one unit", ErrInvalidSize, engine.Printable(q.name))
	}
	return nil
}

// SetLimits changes the quota's limits in Redis, atomically, for every
// client at once, and returns when the change is in force: from the
// change's Redis time on, every start is held to the new limits, and every
// client follows them, whatever limits it was made with (see NewQuota).
// limits must be as many as the quota has and each valid as for NewQuota
// (ErrInvalidSize, ErrInvalidInterval, before any I/O); a quota stored with
// another number of limits is refused with a *MismatchError. A quota that
// does not exist yet is created with limits.
//
// Waiters are re-timed at once: a raised n or a shorter per serves them
// right away, and the queue's head is woken to compute its wake-up under
// the new limits. A waiter asking for more than a lowered n leaves the queue
// and fails with a *TooLargeError.
//
// # The rule across a change
//
// A start is held to the limits in force at its grant time t, over the
// window (t-per, t] of the new per, which counts the units granted before
// the change too. So lowering n admits nothing more until the window holds
// less than the new n, and raising it admits the difference at once. A
// shorter per lets the grants it no longer covers out at once. A longer per
// reaches grants the gate no longer remembers (it drops a grant when it
// leaves the window of the per in force) and counts them as full: after per
// grows from p to p' at Redis time T, no start that takes units of that
// limit is admitted before T+p'-p. This may admit less than the rule
// allows, never more (docs/rate-gate.md, "Changing the rate").
//
// SetLimits with the limits in force changes nothing but the "follow the
// stored limits" rule. Calling it again after a connection error is safe.
// Other errors: ErrWrongType, ErrCorrupt, or a connection error.
func (q *Quota) SetLimits(ctx context.Context, limits ...Limit) error {
	_, err := q.setLimits(ctx, limits)
	return err
}

// setLimits is SetLimits, returning the Redis time the change is in force
// from.
func (q *Quota) setLimits(ctx context.Context, limits []Limit) (time.Time, error) {
	if err := checkLimits(q.name, limits); err != nil {
		return time.Time{}, err
	}
	if len(limits) != len(q.limits) {
		return time.Time{}, fmt.Errorf("%w: rate gate %q: %d limits for a quota of %d", ErrInvalidSize, engine.Printable(q.name), len(limits), len(q.limits))
	}
	var rest []interface{}
	for _, l := range limits {
		rest = append(rest, l.N, l.Per.Microseconds())
	}
	v, _, err := engine.Call(ctx, q.pool, engine.RateSet.With(q.k.state(),
		engine.RateSetArgs{IdleMs: q.cfg.idle.Milliseconds(), Limits: len(limits), Each: rest}))
	at, err := redis.Int64s(v, err)
	if err != nil {
		return time.Time{}, q.scriptError("set rate", err)
	}
	return time.UnixMicro(at[0]), nil
}

func (q *Quota) take(ctx context.Context, units []int, wait bool) (Start, error) {
	if err := q.checkUnits(units); err != nil {
		return Start{}, err
	}
	clk := engine.Clk
	began := clk.Now()
	mode := engine.ModeTry
	if wait {
		mode = engine.ModeWait
	}
	p := &takeUnits{q: q, units: units}
	res, err := engine.Drive(ctx, q.driver(p.fail), p, mode, nil)
	switch {
	case err != nil:
		return Start{}, err
	case res.Granted:
		return Start{
			At:         time.UnixMicro(res.Reply.GrantUs),
			Waited:     clk.Now().Sub(began),
			RetryAfter: res.Reply.Block,
		}, nil
	}
	after := res.Reply.Block
	return Start{Waited: clk.Now().Sub(began), RetryAfter: after},
		&LimitedError{Name: engine.Printable(q.name), RetryAfter: after}
}

// driver is the acquisition driver of q, on q's pools; fail maps the
// protocol's errors.
func (q *Quota) driver(fail func(error) error) *engine.Driver {
	return &engine.Driver{Pool: q.pool, Block: q.block, MaxBlock: &q.maxBlock, Grace: q.cfg.grace, Fail: fail}
}
