package rate

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

	"github.com/redsem/redsem/internal/engine"
)

// Gate admits at most n starts in any window of length per, across every
// process that uses the same name, prefix and Redis: "at most 100 calls per
// second to the partner API". A Gate holds no Redis state of its own and
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
// The package documentation lists the keys.
type Gate struct {
	pool  Pool
	block Pool
	name  string
	n     int
	per   time.Duration
	cfg   config
	k     keys
	// maxBlock caps one blocking wait (ns). It starts at engine.MaxBlock and
	// shrinks when the connection's read timeout turns out to be shorter.
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

// New returns the gate called name that admits n starts per interval per.
// It checks its arguments and does no I/O: the first Wait or Allow by any
// client creates the gate in Redis. A client whose n or per differ from
// those stored gets a *MismatchError (ErrRateMismatch) and nothing changes.
//
// name may hold any bytes (it is encoded before it goes into a key); it must
// not be empty or longer than MaxNameLen (ErrInvalidName). n must be between
// 1 and MaxN (ErrInvalidSize), per between 1ms and MaxPer
// (ErrInvalidInterval). The options are this package's (see options.go);
// an invalid one is refused with ErrInvalidOption.
func New(pool Pool, name string, n int, per time.Duration, opts ...Option) (*Gate, error) {
	if err := engine.CheckPool(pool, "pool"); err != nil {
		return nil, err
	}
	if err := engine.CheckName(name); err != nil {
		return nil, err
	}
	if n < 1 || n > MaxN {
		return nil, fmt.Errorf("%w: rate gate %q: %d starts per interval is not between 1 and %d", ErrInvalidSize, engine.Printable(name), n, MaxN)
	}
	if per < time.Millisecond || per > MaxPer {
		return nil, fmt.Errorf("%w: rate gate %q: interval %v is not between 1ms and %v", ErrInvalidInterval, engine.Printable(name), per, MaxPer)
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	g := &Gate{pool: pool, block: pool, name: name, n: n, per: per, cfg: cfg, k: newKeys(cfg.prefix, name)}
	if cfg.blockPool != nil {
		g.block = cfg.blockPool
	}
	g.maxBlock.Store(int64(engine.MaxBlock))
	return g, nil
}

// Name returns the gate's name as given to New.
func (g *Gate) Name() string { return g.name }

// Limit returns n and per: at most n starts in any window of length per.
func (g *Gate) Limit() (n int, per time.Duration) { return g.n, g.per }

// Wait blocks until a start is allowed and returns it, or until ctx ends.
// Waiters are served in the order they started waiting and sleep in Redis
// rather than poll. An uncontended Wait is one round trip.
//
// When ctx ends first, Wait returns an error for which errors.Is(err,
// ctx.Err()) holds, and the gate loses nothing: a start Redis granted in the
// meantime, which this caller never learnt of, is given back at once. Other
// errors: *MismatchError, ErrWrongType, ErrCorrupt, or a connection error.
func (g *Gate) Wait(ctx context.Context) (Start, error) {
	start := time.Now()
	st, err := g.take(ctx, true)
	return g.observeTake(start, st, err)
}

// Allow returns a start if one is possible now, and a *LimitedError
// (ErrRateLimited) if not; the Start it returns then carries the same
// RetryAfter. It never waits, never jumps ahead of waiting callers, and is
// one round trip.
func (g *Gate) Allow(ctx context.Context) (Start, error) {
	start := time.Now()
	st, err := g.take(ctx, false)
	return g.observeTake(start, st, err)
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

func (g *Gate) takeArgs(acq string, blockUs int64, phase string) []interface{} {
	return append(g.k.args(acq), g.n, g.per.Microseconds(), acq, blockUs,
		g.cfg.grace.Microseconds(), g.tomb().Microseconds(), phase)
}

// tomb is how long an aborted acquisition's tombstone lives: longer than any
// of its scripts can still be on the way.
func (g *Gate) tomb() time.Duration { return engine.MaxBlock + engine.BlockSlack + g.cfg.grace }

// blockFor is the longest the next wait may last (µs): at most maxBlock and
// at most what is left of ctx.
func (g *Gate) blockFor(ctx context.Context) int64 {
	d := time.Duration(g.maxBlock.Load())
	if dl, ok := ctx.Deadline(); ok {
		if rem := time.Until(dl); rem < d {
			d = rem
		}
	}
	return max(d, engine.MinBlock).Microseconds()
}

func (g *Gate) take(ctx context.Context, wait bool) (Start, error) {
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
			if err := engine.CtxErr(ctx); err != nil {
				return Start{}, g.ctxError(err)
			}
			return Start{}, fmt.Errorf("redsem: rate gate %q: %w", engine.Printable(g.name), err)
		}
		st, err := g.takeOn(ctx, conn, wait, began)
		conn.Close()
		var be *brokenWait
		if !errors.As(err, &be) {
			return st, err
		}
		if broken++; broken >= engine.MaxBrokenWaits {
			return Start{}, fmt.Errorf("redsem: rate gate %q: %w", engine.Printable(g.name), be.err)
		}
	}
}

// takeOn runs one acquisition on conn: the fast path, then waits until a
// grant, ctx's end, or a broken connection (a *brokenWait: start over).
func (g *Gate) takeOn(ctx context.Context, conn redis.Conn, wait bool, began time.Time) (Start, error) {
	acq := engine.NewAcqID()
	var block int64
	if wait {
		block = g.blockFor(ctx)
	}
	r, err := parseRateReply(engine.RunScript(ctx, conn, takeScript, g.takeArgs(acq, block, "fresh")...))
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
					&LimitedError{Name: engine.Printable(g.name), RetryAfter: after}
			}
		}
		if err := engine.CtxErr(ctx); err != nil {
			if r.code == 0 {
				// Leave the queue (and give back a start granted meanwhile).
				g.settle(ctx, acq)
			}
			return Start{}, g.ctxError(err)
		}
		if r.code != 0 {
			// Settled behind our back (dropped as dead, or given back):
			// start over as a new acquisition.
			acq, blockLeft = engine.NewAcqID(), 0
			r, err = parseRateReply(engine.RunScript(ctx, conn, takeScript, g.takeArgs(acq, g.blockFor(ctx), "fresh")...))
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
func (g *Gate) waitOnce(ctx context.Context, conn redis.Conn, acq string, r rateReply) (rateReply, error) {
	d := usDuration(r.waitUs)
	if r.head && d <= localWake {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return rateReply{}, ctx.Err()
		case <-t.C:
		}
		return parseRateReply(engine.RunScript(ctx, conn, takeScript, g.takeArgs(acq, g.blockFor(ctx), "wait")...))
	}
	if r.head {
		d -= localWake
	}
	args := g.takeArgs(acq, g.blockFor(ctx), "wait")
	secs := strconv.FormatFloat(math.Ceil(float64(d.Microseconds())/1000)/1000, 'f', 3, 64)
	if err := conn.Send("BLPOP", args[6], secs); err != nil {
		return rateReply{}, err
	}
	if err := takeScript.SendHash(conn, args...); err != nil {
		return rateReply{}, err
	}
	if err := conn.Flush(); err != nil {
		return rateReply{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, d+engine.BlockSlack)
	defer cancel()
	_, popErr := redis.ReceiveContext(conn, rctx)
	if popErr != nil && popErr != redis.ErrNil && !engine.IsRedisError(popErr) {
		return rateReply{}, popErr
	}
	v, err := redis.ReceiveContext(conn, rctx)
	if re, ok := err.(redis.Error); ok && strings.HasPrefix(string(re), "NOSCRIPT") {
		v, err = takeScript.DoContext(ctx, conn, args...)
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
func (g *Gate) failedTake(ctx context.Context, acq string, err error, blockLeft time.Duration) (rateReply, error) {
	if engine.IsRedisError(err) {
		return rateReply{}, g.scriptError("wait", err)
	}
	var se *scriptErr
	if errors.As(err, &se) {
		return rateReply{}, se.err
	}
	if engine.CtxErr(ctx) == nil {
		// The wait broke while its caller still waits: resolve it by id,
		// bounded by ctx too, so that a caller whose context ends meanwhile
		// returns within the settle bound below.
		rctx, cancel := context.WithTimeout(ctx, engine.SettleTimeout)
		r, aerr := g.abort(rctx, acq, "resolve")
		cancel()
		switch {
		case aerr == nil && r.code == 1:
			return r, nil
		case aerr == nil:
			return rateReply{}, g.brokenWait(err, blockLeft)
		case engine.CtxErr(ctx) == nil:
			return rateReply{}, fmt.Errorf("redsem: rate gate %q: %w (settling it failed too: %v)", engine.Printable(g.name), err, aerr)
		}
	}
	g.settle(ctx, acq)
	return rateReply{}, g.ctxError(engine.CtxErr(ctx))
}

// brokenWait is what a wait whose connection broke before its BLPOP's own
// timeout (blockLeft was left of it) returns, so that take starts over on a
// fresh connection.
func (g *Gate) brokenWait(err error, blockLeft time.Duration) error {
	if blockLeft > time.Second {
		// The read deadline came well before the BLPOP's own timeout: the
		// connection's read timeout is shorter than our block. Block less.
		if cur := time.Duration(g.maxBlock.Load()); cur > time.Second {
			g.maxBlock.Store(int64(cur / 2))
		}
	}
	return &brokenWait{err}
}

// settle leaves the queue for a wait whose context ended, giving back a
// start granted meanwhile, as a cancelled Acquire settles: the abort runs in
// the background, bounded by engine.SettleTimeout, and the caller waits for
// it engine.SettleWait at most, so a cancelled Wait returns within that
// bound even when Redis stops answering.
func (g *Gate) settle(ctx context.Context, acq string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engine.SettleTimeout)
		defer cancel()
		_, _ = g.abort(actx, acq, "release")
	}()
	t := time.NewTimer(engine.SettleWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// abort runs rate_abort.lua (idempotent: it settles by acquisition id)
// under actx, once more on another connection if the pooled one was dead.
func (g *Gate) abort(actx context.Context, acq, mode string) (rateReply, error) {
	args := append(g.k.args(acq), acq, mode, g.tomb().Microseconds())
	v, _, err := engine.Call(actx, g.pool, abortScript, args...)
	return parseRateReply(v, err)
}

func (g *Gate) ctxError(err error) error {
	return fmt.Errorf("redsem: rate gate %q: %w", engine.Printable(g.name), err)
}

// scriptError maps the rate scripts' error replies to the sentinels.
func (g *Gate) scriptError(op string, err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(string(re), "REDSEM_RATE ") {
		var n int
		var perUs int64
		_, _ = fmt.Sscanf(string(re), "REDSEM_RATE %d %d", &n, &perUs)
		return &MismatchError{Name: g.name, N: g.n, Per: g.per, StoredN: n, StoredPer: usDuration(perUs)}
	}
	// The common mapping covers the rest (wrong type, corrupt state).
	return engine.ScriptError(op, "rate gate", g.name, err)
}

func usDuration(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// The rate gate's scripts, after the helpers they share with the
// semaphore's (common.lua) and with each other (rate_common.lua).
var (
	takeScript  = engine.NewScript(keyCount, "rate_take.lua", "common.lua", "rate_common.lua")
	abortScript = engine.NewScript(keyCount, "rate_abort.lua", "common.lua", "rate_common.lua")
)

// brokenWait reports that the blocked connection broke while ctx was still
// live and the acquisition was settled without a grant: start over.
type brokenWait struct{ err error }

func (e *brokenWait) Error() string { return e.err.Error() }

// scriptErr carries an error already mapped by scriptError.
type scriptErr struct{ err error }

func (e *scriptErr) Error() string { return e.err.Error() }
