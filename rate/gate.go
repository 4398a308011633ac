package rate

import (
	"context"
	"errors"
	"fmt"
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
	code    int64 // engine.CodeGranted, CodeWaiting (none free), CodeSettled (start over), CodeReleased
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

// driver is the acquisition driver of g (engine.Drive), on g's pools.
func (g *Gate) driver() *engine.Driver {
	return &engine.Driver{Pool: g.pool, Block: g.block, MaxBlock: &g.maxBlock, Grace: g.cfg.grace}
}

func (g *Gate) take(ctx context.Context, wait bool) (Start, error) {
	began := time.Now()
	mode := engine.ModeTry
	if wait {
		mode = engine.ModeWait
	}
	res, err := engine.Drive[rateReply](ctx, g.driver(), &oneStart{g: g}, mode, nil)
	switch {
	case err != nil:
		return Start{}, err
	case res.Granted:
		return Start{
			At:         time.UnixMicro(res.Reply.grantUs),
			Waited:     time.Since(began),
			RetryAfter: usDuration(res.Reply.waitUs),
		}, nil
	}
	after := usDuration(res.Reply.waitUs)
	return Start{Waited: time.Since(began), RetryAfter: after},
		&LimitedError{Name: engine.Printable(g.name), RetryAfter: after}
}

// oneStart is the driver's protocol for one start: rate_take.lua, behind
// BLPOP on the waiter's doorbell, and rate_abort.lua.
type oneStart struct{ g *Gate }

func (p *oneStart) First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (rateReply, error) {
	return parseRateReply(engine.RunScript(ctx, conn, takeScript, p.g.takeArgs(acq, block.Microseconds(), "fresh")...))
}

// Wait waits as rate_take.lua said, then runs it again (phase "wait"). A
// waiter sleeps in BLPOP on its doorbell with the script right behind it in
// the same write, so the script runs the moment the doorbell rings. The
// queue's head sleeps its last localWake on a local timer, because Redis
// times BLPOP out only on its cron tick.
func (p *oneStart) Wait(ctx context.Context, conn redis.Conn, acq string, r rateReply, next time.Duration) (rateReply, error) {
	g := p.g
	args := g.takeArgs(acq, next.Microseconds(), "wait")
	d := usDuration(r.waitUs)
	if r.head && d <= localWake {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return rateReply{}, ctx.Err()
		case <-t.C:
		}
		return parseRateReply(engine.RunScript(ctx, conn, takeScript, args...))
	}
	if r.head {
		d -= localWake
	}
	return parseRateReply(engine.BlockThenRun(ctx, conn, d, engine.BLPOP(g.k.inbox(acq)),
		takeScript, args, func(err error) error { return g.scriptError("wait", err) }))
}

// Abort runs rate_abort.lua (idempotent: it settles by acquisition id),
// once more on another connection if the pooled one was dead.
func (p *oneStart) Abort(ctx context.Context, acq, mode string) (rateReply, error) {
	g := p.g
	args := append(g.k.args(acq), acq, mode, g.tomb().Microseconds())
	v, _, err := engine.Call(ctx, g.pool, abortScript, args...)
	return parseRateReply(v, err)
}

func (p *oneStart) Code(r rateReply) int64 { return r.code }

func (p *oneStart) Block(r rateReply) time.Duration { return usDuration(r.waitUs) }

func (p *oneStart) Moves(rateReply) bool { return false }

func (p *oneStart) Observe(rateReply, time.Time) {}

func (p *oneStart) Accept(context.Context, string, rateReply, time.Time) (bool, error) {
	return true, nil
}

func (p *oneStart) Error(err error) error { return p.g.scriptError("wait", err) }

func (p *oneStart) Wrap(err error) error {
	return fmt.Errorf("redsem: rate gate %q: %w", engine.Printable(p.g.name), err)
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
