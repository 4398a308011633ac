package redsem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
)

// RateGate admits at most n starts in any window of length per, across every
// process that uses the same name, prefix and Redis: "at most 100 calls per
// second to the partner API". A RateGate holds no Redis state of its own and
// is safe for concurrent use; create one per name and share it.
//
// It runs on the semaphore's machinery. The gate is n start tokens; a
// granted start takes one and records a lease on it scored by Redis TIME,
// the grant time plus per. That lease is never released early: the token
// comes back by itself when Redis time reaches its score. Two grants of one
// token are therefore at least per apart, and any n+1 grants span at least
// per. A client that crashes right after its grant loses nothing: its token
// comes back per after it was taken, as every token does.
//
// Waiters queue in Redis, first come, first served, and sleep in BLPOP on a
// doorbell of their own; a token that comes back is granted to the oldest
// waiter by whichever script sees it first, and its doorbell is rung. The
// oldest waiter keeps time for the queue: it wakes at the earliest token
// return (on a local timer for the last 250ms, because Redis fires blocking
// timeouts only on its cron tick, every 100ms at the default hz) and takes
// that token, then rings the next waiter, which keeps time in its turn. No
// client polls and no daemon runs.
//
// The guarantee is on grant times, by Redis TIME (Start.At). A call begins
// when its Wait returns, later than its grant by the reply's trip and the
// caller's scheduling; if those delays vary by up to d, the calls' own start
// times keep at most n starts in any window of length per-d. Configure a
// little below the external quota (e.g. 95 per second for 100) when the
// remote side counts strictly.
//
// Keys, all under the name's hash tag and apart from a Semaphore's keys of
// the same name:
//
//	<prefix>{<name>}:rate:meta     hash: n, per, epoch, last grant, timer
//	<prefix>{<name>}:rate:tokens   list: free start tokens
//	<prefix>{<name>}:rate:leases   zset: token -> return time (µs, Redis TIME)
//	<prefix>{<name>}:rate:holders  hash: token -> grant, acquisition -> token
//	<prefix>{<name>}:rate:queue    list: waiting acquisitions, oldest first
//	<prefix>{<name>}:rate:waits    zset: waiter liveness deadlines, tombstones
//	<prefix>{<name>}:rate:in:<id>  list: a waiter's doorbell
type RateGate struct {
	pool  Pool
	block Pool
	name  string
	n     int
	per   time.Duration
	cfg   config
	k     keys
	// maxBlock caps one blocking wait (ns); see Semaphore.maxBlock.
	maxBlock atomic.Int64
}

// Start reports a start granted by Wait or Allow, or, with a refused Allow,
// when to try again.
type Start struct {
	// At is the Redis TIME of the grant. Grant times of a gate strictly
	// increase, and no window of length per holds more than n of them.
	// For a refused Allow it is zero.
	At time.Time
	// Waited is how long the call took, from entry to the grant, on this
	// process's monotonic clock (one round trip when nothing was waited).
	Waited time.Duration
	// RetryAfter is how long from the reply until another start may be
	// possible: 0 while tokens are free and nobody queues, else until the
	// earliest token returns. Waiting callers are served first, so it is a
	// lower bound. For a refused Allow it is the Retry-After to report.
	RetryAfter time.Duration
}

// localWake is how close to its wake-up time the queue's head stops sleeping
// in BLPOP and sleeps on a local timer instead: Redis times blocking commands
// out on its cron tick (1/hz, 100ms by default), far too coarse for a rate.
const localWake = 250 * time.Millisecond

// NewRateGate returns the gate called name that admits n starts per
// interval per. It checks its arguments and does no I/O: the first Wait or
// Allow by any client creates the gate in Redis. A client whose n or per
// differ from those stored gets a *RateMismatchError and nothing changes.
//
// n must be between 1 and MaxSize (ErrInvalidSize otherwise), per between
// 1ms and MaxTTL (ErrInvalidInterval), name as for NewSemaphore. Options:
// WithPrefix, WithGrace (how long past its expected wake a silent waiter is
// still kept in the queue) and WithBlockingPool; the lease options WithTTL,
// WithAutoRefresh and WithLabel do not apply and are refused with
// ErrInvalidOption.
func NewRateGate(pool Pool, name string, n int, per time.Duration, opts ...Option) (*RateGate, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidOption)
	}
	if p, ok := pool.(*redis.Pool); ok && p == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidOption)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if n < 1 || n > MaxSize {
		return nil, fmt.Errorf("%w: rate gate %q: %d starts per interval is not between 1 and %d", ErrInvalidSize, printable(name), n, MaxSize)
	}
	if per < time.Millisecond || per > MaxTTL {
		return nil, fmt.Errorf("%w: rate gate %q: interval %v is not between 1ms and %v", ErrInvalidInterval, printable(name), per, MaxTTL)
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	// Options are applied to an empty config too, to see which were given.
	var given config
	for _, o := range opts {
		_ = o.apply(&given)
	}
	if given.ttl != 0 || given.autoRefresh || given.label != "" {
		return nil, fmt.Errorf("%w: WithTTL, WithAutoRefresh and WithLabel do not apply to a rate gate", ErrInvalidOption)
	}
	g := &RateGate{pool: pool, block: pool, name: name, n: n, per: per, cfg: cfg, k: newRateKeys(cfg.prefix, name)}
	if cfg.blockPool != nil {
		g.block = cfg.blockPool
	}
	g.maxBlock.Store(int64(maxBlock))
	return g, nil
}

// newRateKeys returns the gate's keys: the semaphore's layout under
// <prefix>{<name>}:rate:, so a gate and a semaphore of one name share a slot
// but never a key. lua/rate_common.lua says what each key holds.
func newRateKeys(prefix, name string) keys {
	return keysAt(prefix + "{" + encodeName(name) + "}:rate:")
}

// rateKeys returns the keys the rate scripts take for acquisition acq.
func (g *RateGate) rateKeys(acq string) []interface{} {
	k := g.k
	return []interface{}{k.meta, k.tokens, k.leases, k.holders, k.base + "queue", k.waits, k.base + "in:" + acq}
}

// Name returns the gate's name as given to NewRateGate.
func (g *RateGate) Name() string { return g.name }

// Limit returns n and per: at most n starts in any window of length per.
func (g *RateGate) Limit() (n int, per time.Duration) { return g.n, g.per }

// Wait blocks until a start is allowed and returns it, or until ctx ends.
// Waiters are served in the order they started waiting and sleep in Redis
// rather than poll. An uncontended Wait is one round trip.
//
// When ctx ends first, Wait returns an error for which errors.Is(err,
// ctx.Err()) holds, and the gate loses nothing: a start Redis granted in the
// meantime, which this caller never learnt of, is given back at once. Other
// errors: *RateMismatchError, ErrWrongType, ErrCorrupt, or a connection error.
func (g *RateGate) Wait(ctx context.Context) (Start, error) {
	return g.take(ctx, true)
}

// Allow returns a start if one is possible now, and a *RateLimitedError
// (ErrRateLimited) if not; the Start it returns then carries the same
// RetryAfter. It never waits, never jumps ahead of waiting callers, and is
// one round trip.
func (g *RateGate) Allow(ctx context.Context) (Start, error) {
	return g.take(ctx, false)
}

// rateReply is a decoded reply of rate_take.lua or rate_abort.lua.
type rateReply struct {
	code    int64 // 1 granted, 0 none free, 2 settled: start over, 3 given back
	token   string
	grantUs int64
	waitUs  int64 // code 1: until the next start may be possible; code 0: how long to wait
	nowUs   int64
	head    bool
}

func parseRateReply(v interface{}, err error) (rateReply, error) {
	vals, err := redis.Values(v, err)
	if err != nil {
		return rateReply{}, err
	}
	var r rateReply
	switch len(vals) {
	case 5:
		_, err = redis.Scan(vals, &r.code, &r.token, &r.grantUs, &r.waitUs, &r.nowUs)
	case 4:
		var head int64
		_, err = redis.Scan(vals, &r.code, &r.waitUs, &r.nowUs, &head)
		r.head = head == 1
	case 3:
		_, err = redis.Scan(vals, &r.code, &r.waitUs, &r.nowUs)
	default:
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	return r, err
}

func (g *RateGate) takeArgs(acq string, blockUs int64, phase string) []interface{} {
	return append(g.rateKeys(acq), g.n, g.per.Microseconds(), acq, blockUs,
		g.cfg.grace.Microseconds(), g.tomb().Microseconds(), phase)
}

// tomb is how long an aborted acquisition's tombstone lives: longer than any
// of its scripts can still be on the way.
func (g *RateGate) tomb() time.Duration { return maxBlock + blockSlack + g.cfg.grace }

// blockFor is the longest the next wait may last (µs): at most maxBlock and
// at most what is left of ctx.
func (g *RateGate) blockFor(ctx context.Context) int64 {
	d := time.Duration(g.maxBlock.Load())
	if dl, ok := ctx.Deadline(); ok {
		if rem := time.Until(dl); rem < d {
			d = rem
		}
	}
	return max(d, minBlock).Microseconds()
}

func (g *RateGate) take(ctx context.Context, wait bool) (Start, error) {
	began := time.Now()
	if err := ctx.Err(); err != nil {
		return Start{}, g.ctxError(err)
	}
	pool := g.pool
	if wait {
		pool = g.block
	}
	broken := 0
	for {
		conn, err := pool.GetContext(ctx)
		if err != nil {
			if err := ctxErr(ctx); err != nil {
				return Start{}, g.ctxError(err)
			}
			return Start{}, fmt.Errorf("redsem: rate gate %q: %w", printable(g.name), err)
		}
		st, err := g.takeOn(ctx, conn, wait, began)
		conn.Close()
		var be *brokenWait
		if !errors.As(err, &be) {
			return st, err
		}
		if broken++; broken >= maxBrokenWaits {
			return Start{}, fmt.Errorf("redsem: rate gate %q: %w", printable(g.name), be.err)
		}
	}
}

// takeOn runs one acquisition on conn: the fast path, then waits until a
// grant, ctx's end, or a broken connection (a *brokenWait: start over).
func (g *RateGate) takeOn(ctx context.Context, conn redis.Conn, wait bool, began time.Time) (Start, error) {
	acq := newAcqID()
	var block int64
	if wait {
		block = g.blockFor(ctx)
	}
	r, err := parseRateReply(runScript(ctx, conn, rateTakeScript, g.takeArgs(acq, block, "fresh")...))
	var blockLeft time.Duration
	for {
		if err != nil {
			if r, err = g.failedTake(ctx, acq, err, blockLeft); err != nil {
				return Start{}, err
			}
		}
		switch r.code {
		case 1:
			return Start{
				At:         time.UnixMicro(r.grantUs),
				Waited:     time.Since(began),
				RetryAfter: usDuration(r.waitUs),
			}, nil
		case 0:
			if !wait {
				after := usDuration(r.waitUs)
				return Start{Waited: time.Since(began), RetryAfter: after},
					&RateLimitedError{Name: printable(g.name), RetryAfter: after}
			}
		}
		if err := ctxErr(ctx); err != nil {
			if r.code == 0 {
				// Leave the queue (and give back a start granted meanwhile).
				_, _ = g.abort(ctx, acq, "release")
			}
			return Start{}, g.ctxError(err)
		}
		if r.code != 0 {
			// Settled behind our back (dropped as dead, or given back):
			// start over as a new acquisition.
			acq, blockLeft = newAcqID(), 0
			r, err = parseRateReply(runScript(ctx, conn, rateTakeScript, g.takeArgs(acq, g.blockFor(ctx), "fresh")...))
			continue
		}
		used, started := usDuration(r.waitUs), time.Now()
		r, err = g.waitOnce(ctx, conn, acq, r)
		blockLeft = used - time.Since(started)
	}
}

// waitOnce waits as rate_take.lua said, then runs it again (phase "wait").
// A waiter sleeps in BLPOP on its doorbell with the script right behind it
// in the same write, so the script runs the moment the doorbell rings. The
// queue's head sleeps its last localWake on a local timer, because Redis
// times BLPOP out only on its cron tick.
func (g *RateGate) waitOnce(ctx context.Context, conn redis.Conn, acq string, r rateReply) (rateReply, error) {
	d := usDuration(r.waitUs)
	if r.head && d <= localWake {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return rateReply{}, ctx.Err()
		case <-t.C:
		}
		return parseRateReply(runScript(ctx, conn, rateTakeScript, g.takeArgs(acq, g.blockFor(ctx), "wait")...))
	}
	if r.head {
		d -= localWake
	}
	args := g.takeArgs(acq, g.blockFor(ctx), "wait")
	secs := strconv.FormatFloat(math.Ceil(float64(d.Microseconds())/1000)/1000, 'f', 3, 64)
	if err := conn.Send("BLPOP", args[6], secs); err != nil {
		return rateReply{}, err
	}
	if err := rateTakeScript.SendHash(conn, args...); err != nil {
		return rateReply{}, err
	}
	if err := conn.Flush(); err != nil {
		return rateReply{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, d+blockSlack)
	defer cancel()
	_, popErr := redis.ReceiveContext(conn, rctx)
	if popErr != nil && popErr != redis.ErrNil && !isRedisError(popErr) {
		return rateReply{}, popErr
	}
	v, err := redis.ReceiveContext(conn, rctx)
	if re, ok := err.(redis.Error); ok && strings.HasPrefix(string(re), "NOSCRIPT") {
		v, err = rateTakeScript.DoContext(ctx, conn, args...)
	}
	if popErr != nil && popErr != redis.ErrNil {
		return rateReply{}, &scriptErr{g.scriptError("wait", popErr)}
	}
	return parseRateReply(v, err)
}

// failedTake settles an acquisition whose reply was not read: a script may
// have granted a start, or the waiter may still be queued. With ctx ended
// the start is given back and ctx's error returned. Otherwise a granted
// start is kept (returned), and without one a *brokenWait tells take to
// start over on a fresh connection.
func (g *RateGate) failedTake(ctx context.Context, acq string, err error, blockLeft time.Duration) (rateReply, error) {
	if isRedisError(err) {
		return rateReply{}, g.scriptError("wait", err)
	}
	var se *scriptErr
	if errors.As(err, &se) {
		return rateReply{}, se.err
	}
	if cerr := ctxErr(ctx); cerr != nil {
		_, _ = g.abort(ctx, acq, "release")
		return rateReply{}, g.ctxError(cerr)
	}
	r, aerr := g.abort(ctx, acq, "resolve")
	if aerr != nil {
		return rateReply{}, fmt.Errorf("redsem: rate gate %q: %w (settling it failed too: %v)", printable(g.name), err, aerr)
	}
	if r.code == 1 {
		return r, nil
	}
	if blockLeft > time.Second {
		// The read deadline came well before the BLPOP's own timeout: the
		// connection's read timeout is shorter than our block. Block less.
		if cur := time.Duration(g.maxBlock.Load()); cur > time.Second {
			g.maxBlock.Store(int64(cur / 2))
		}
	}
	return rateReply{}, &brokenWait{err}
}

// abort runs rate_abort.lua on a fresh connection with a bounded context
// that survives the caller's cancellation.
func (g *RateGate) abort(ctx context.Context, acq, mode string) (rateReply, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	conn, err := g.pool.GetContext(actx)
	if err != nil {
		return rateReply{}, err
	}
	defer conn.Close()
	args := append(g.rateKeys(acq), acq, mode, g.tomb().Microseconds())
	return parseRateReply(rateAbortScript.DoContext(actx, conn, args...))
}

func (g *RateGate) ctxError(err error) error {
	return fmt.Errorf("redsem: rate gate %q: %w", printable(g.name), err)
}

// scriptError maps the rate scripts' error replies to the sentinels.
func (g *RateGate) scriptError(op string, err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(string(re), "REDSEM_RATE ") {
		var n int
		var perUs int64
		_, _ = fmt.Sscanf(string(re), "REDSEM_RATE %d %d", &n, &perUs)
		return &RateMismatchError{Name: g.name, N: g.n, Per: g.per, StoredN: n, StoredPer: usDuration(perUs)}
	}
	// The common mapping covers the rest (wrong type, corrupt state).
	return scriptError(op, "rate gate", g.name, g.n, err)
}

func usDuration(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
