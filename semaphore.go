package redsem

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Pool is where a Semaphore gets its Redis connections. *redis.Pool
// satisfies it. Connections must support context (redis.ConnWithContext) and
// timeouts (redis.ConnWithTimeout), as redigo's own connections do.
type Pool interface {
	GetContext(ctx context.Context) (redis.Conn, error)
}

// Semaphore is a counting semaphore of a fixed size shared through Redis: at
// most Size leases exist at any moment, across every process that uses the
// same name, prefix and Redis. A Semaphore holds no Redis state of its own
// and is safe for concurrent use; create one per name and share it.
type Semaphore struct {
	pool  Pool
	block Pool
	name  string
	size  int
	cfg   config
	k     keys
	clock serverClock
	q     waitQueue // goroutines of this process waiting (wait.go)
	// maxBlock caps one blocking wait (ns). It starts at maxBlock and shrinks
	// when the connection's read timeout turns out to be shorter.
	maxBlock atomic.Int64
	// kind is whose leases this carries: a semaphore's (nil), or an
	// RWMutex's, whose Semaphore only carries the pools, options and
	// clock its leases share with a semaphore's (see rwmutex.go).
	kind *leaseKind
}

// leaseKind is the kind of the leases s grants.
func (s *Semaphore) leaseKind() *leaseKind {
	if s.kind == nil {
		return semaphoreLeases
	}
	return s.kind
}

// NewSemaphore returns the semaphore called name with size tokens. It checks
// its arguments and does no I/O: the first Acquire by any client creates the
// semaphore in Redis, atomically. A client whose size differs from the size
// stored in Redis gets a *SizeMismatchError (ErrSizeMismatch) from Acquire and
// TryAcquire, and nothing changes.
//
// name may hold any bytes (it is encoded before it goes into a key); it must
// not be empty or longer than 512 bytes. size must be between 1 and MaxSize.
func NewSemaphore(pool Pool, name string, size int, opts ...Option) (*Semaphore, error) {
	if err := engine.CheckPool(pool, "pool"); err != nil {
		return nil, err
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if size < 1 || size > MaxSize {
		return nil, fmt.Errorf("%w: %d is not between 1 and %d", ErrInvalidSize, size, MaxSize)
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	s := &Semaphore{pool: pool, block: pool, name: name, size: size, cfg: cfg, k: newKeys(cfg.prefix, name)}
	if cfg.blockPool != nil {
		s.block = cfg.blockPool
	}
	s.maxBlock.Store(int64(maxBlock))
	return s, nil
}

// Name returns the semaphore's name as given to NewSemaphore.
func (s *Semaphore) Name() string { return s.name }

// Size returns the number of tokens.
func (s *Semaphore) Size() int { return s.size }

// TTL returns the lease TTL new leases get.
func (s *Semaphore) TTL() time.Duration { return s.cfg.ttl }

// Acquire blocks until a token is free and returns a lease on it, or until
// ctx ends. Waiters are served in the order they started waiting (Redis
// serves blocked clients first come, first served), and they sleep in Redis
// (BLMOVE) rather than poll. An uncontended Acquire is one round trip.
//
// When ctx ends first, Acquire returns an error for which errors.Is(err,
// ctx.Err()) holds, and no token is lost: a token Redis handed over in the
// meantime is given back. Other errors: *SizeMismatchError, ErrWrongType,
// ErrCorrupt, ErrStaleGrant, or a connection error.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) {
	start := time.Now()
	var l *Lease
	var err error
	if s.cfg.waitConns > 0 {
		l, err = s.acquireShared(ctx)
	} else {
		l, err = s.acquire(ctx, true)
	}
	return s.observeAcquire(start, l, err)
}

// TryAcquire returns a lease if a token is free now, and ErrNoToken if none
// is. It never waits for a token; it is one round trip, or a few when a
// grant reaches it after its lease's local deadline (then it gives the token
// back and tries again, 3 times at most, then returns ErrStaleGrant).
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) {
	start := time.Now()
	l, err := s.acquire(ctx, false)
	return s.observeAcquire(start, l, err)
}

// acquireReply is a decoded reply of acquire.lua or abort.lua.
type acquireReply struct {
	code       int64 // engine.CodeGranted, CodeWaiting (none free), CodeSettled, CodeReleased
	token      string
	fence      int64
	deadlineMs int64
	blockMs    int64
	nowUs      int64
}

func parseAcquireReply(v interface{}, err error) (acquireReply, error) {
	vals, err := redis.Values(v, err)
	if err != nil {
		return acquireReply{}, err
	}
	var r acquireReply
	if len(vals) == 5 {
		_, err = redis.Scan(vals, &r.code, &r.token, &r.fence, &r.deadlineMs, &r.nowUs)
	} else if len(vals) == 3 {
		_, err = redis.Scan(vals, &r.code, &r.blockMs, &r.nowUs)
	} else {
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	return r, err
}

// acquireArgs are acquire.lua's keys and arguments. phase is "fresh" for an
// acquisition's first call and "wait" behind its BLMOVE.
func (s *Semaphore) acquireArgs(acq string, blockMs int64, phase string) []interface{} {
	args := []engine.Arg{
		engine.A("size", s.size), engine.A("acqID", acq), engine.A("ttlMs", s.cfg.ttl.Milliseconds()),
		engine.A("label", s.cfg.label), engine.A("blockMs", blockMs), engine.A("graceMs", s.cfg.grace.Milliseconds()),
		engine.A("tombMs", s.tombMs()), engine.A("phase", phase),
	}
	// The size mode and idle time are left out when they are the defaults
	// (each argument costs Redis time on every call).
	switch idle := s.cfg.idle.Milliseconds(); {
	case idle > 0:
		args = append(args, engine.A("sizeMode", s.sizeMode()), engine.A("idleMs", idle))
	case s.cfg.adoptSize:
		args = append(args, engine.A("sizeMode", s.sizeMode()))
	}
	return engine.Args(acquireScript, append(s.k.all(5), s.k.pend(acq)), args...)
}

// tombMs is how long an aborted acquisition's tombstone lives: longer than
// any BLMOVE of it can still be registered in Redis.
func (s *Semaphore) tombMs() int64 {
	return (maxBlock + blockSlack + s.cfg.grace).Milliseconds()
}

// maxStaleGrants bounds how many grants in a row an acquisition gives back
// because they reached it after their lease's local deadline.
const maxStaleGrants = 3

// acquireMode says how far one acquisition goes (engine.Mode).
type acquireMode = engine.Mode

const (
	modeTry      = engine.ModeTry      // the fast path only: ErrNoToken when none is free
	modeRegister = engine.ModeRegister // the fast path; when none is free, stay registered as waiting and return that
	modeWait     = engine.ModeWait     // wait until a grant or ctx's end
)

// acquireStart is an acquisition whose fast path already ran and found no
// token: registered as waiting in Redis, ready for its first BLMOVE.
type acquireStart = engine.Pending[acquireReply]

// driver is the acquisition driver of s (engine.Drive), on s's pools and
// the current time source.
func (s *Semaphore) driver() *engine.Driver {
	return &engine.Driver{Pool: s.pool, Block: s.block, MaxBlock: &s.maxBlock, Grace: s.cfg.grace, Clock: clk}
}

func (s *Semaphore) acquire(ctx context.Context, wait bool) (*Lease, error) {
	mode := modeTry
	if wait {
		mode = modeWait
	}
	l, _, err := s.acquireFrom(ctx, mode, nil)
	return l, err
}

// acquireFrom runs an acquisition of one token in mode, continuing start if
// given. In modeRegister a refusal returns the registration.
func (s *Semaphore) acquireFrom(ctx context.Context, mode acquireMode, start *acquireStart) (*Lease, *acquireStart, error) {
	p := &oneToken{s: s}
	res, err := engine.Drive[acquireReply](ctx, s.driver(), p, mode, start)
	switch {
	case err != nil:
		return nil, nil, err
	case res.Granted:
		return p.lease, nil, nil
	case res.Pending != nil:
		return nil, res.Pending, nil
	}
	return nil, nil, fmt.Errorf("%w: semaphore %q", ErrNoToken, printable(s.name))
}

// oneToken is the driver's protocol for one token: acquire.lua, BLMOVE from
// the token list into the waiter's pending list, abort.lua.
type oneToken struct {
	s     *Semaphore
	lease *Lease
	stale int // grants in a row that were unusable on arrival
}

func (p *oneToken) First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (acquireReply, error) {
	return parseAcquireReply(runScript(ctx, conn, acquireScript, p.s.acquireArgs(acq, block.Milliseconds(), "fresh")...))
}

// Wait writes BLMOVE and acquire.lua in one write: when a token reaches
// this waiter, Redis runs the script right behind the BLMOVE and the lease
// is recorded before the client reads a byte (see doc.go, Model).
func (p *oneToken) Wait(ctx context.Context, conn redis.Conn, acq string, r acquireReply, next time.Duration) (acquireReply, error) {
	s := p.s
	return parseAcquireReply(engine.BlockThenRun(ctx, conn, p.Block(r),
		engine.BLMOVE(s.k.tokens, s.k.pend(acq)),
		acquireScript, s.acquireArgs(acq, next.Milliseconds(), "wait"), p.Error))
}

func (p *oneToken) Abort(ctx context.Context, acq, mode string) (acquireReply, error) {
	return p.s.abort(ctx, acq, mode)
}

func (p *oneToken) Code(r acquireReply) int64 { return r.code }

func (p *oneToken) Block(r acquireReply) time.Duration {
	return time.Duration(r.blockMs) * time.Millisecond
}

func (p *oneToken) Moves(acquireReply) bool { return true }

func (p *oneToken) Observe(r acquireReply, sent time.Time) {
	p.s.clock.observe(monoUs(sent), r.nowUs)
	if r.code == engine.CodeWaiting {
		p.stale = 0
	}
}

// Accept takes a grant, unless it is older than our view of its lease
// allows (this process was frozen while Redis handed it the token): such a
// grant is never used but given back, and the acquisition goes on, but not
// forever: grants that keep arriving too late would loop.
func (p *oneToken) Accept(ctx context.Context, acq string, r acquireReply, sent time.Time) (bool, error) {
	s := p.s
	l := s.newLease(acq, r, monoUs(sent))
	if l.Valid() {
		p.lease = l.use()
		return true, nil
	}
	s.giveBack(ctx, l)
	if p.stale++; p.stale >= maxStaleGrants {
		return false, fmt.Errorf("%w: semaphore %q: %d grants in a row were past their local deadline on arrival (TTL %v)",
			ErrStaleGrant, printable(s.name), p.stale, s.cfg.ttl)
	}
	return false, nil
}

func (p *oneToken) Error(err error) error { return p.s.scriptError("acquire", err) }

func (p *oneToken) Wrap(err error) error { return p.s.ctxError(err) }

// settle gives back whatever acquisition acq may hold (engine.Settle).
func (s *Semaphore) settle(ctx context.Context, acq string) {
	engine.Settle[acquireReply](ctx, s.driver(), &oneToken{s: s}, acq)
}

// giveBack releases a grant the acquisition will not use. Like settle, it
// never holds the caller long after ctx has ended against a server that does
// not answer: then it waits settleWait at most, and the release goes on in
// the background (bounded by releaseTimeout).
func (s *Semaphore) giveBack(ctx context.Context, l *Lease) {
	done := make(chan struct{})
	clk.Go(func() {
		defer close(done)
		_ = l.Release(ctx)
	})
	clk.WaitOrDone(ctx, done, releaseTimeout+time.Second)
	if ctx.Err() != nil {
		clk.WaitOrDone(context.Background(), done, settleWait)
	}
}

// settleTimeout bounds settling an acquisition whose reply was lost;
// settleWait is how long a cancelled Acquire waits for that before it
// returns.
const (
	settleTimeout = engine.SettleTimeout
	settleWait    = engine.SettleWait
)

// abort runs abort.lua for acq in the given mode ("release" or "resolve").
func (s *Semaphore) abort(actx context.Context, acq, mode string) (acquireReply, error) {
	sent := monoNow()
	args := engine.Args(abortScript, append(s.k.all(5), s.k.pend(acq)),
		engine.A("acqID", acq), engine.A("mode", mode), engine.A("tombMs", s.tombMs()))
	v, _, err := s.call(actx, abortScript, args...)
	r, err := parseAcquireReply(v, err)
	if err == nil {
		s.clock.observe(sent, r.nowUs)
	}
	return r, err
}

func (s *Semaphore) ctxError(err error) error {
	return fmt.Errorf("redsem: acquire semaphore %q: %w", printable(s.name), err)
}
