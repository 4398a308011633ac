package redsem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/failpoint"
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
}

// NewSemaphore returns the semaphore called name with size tokens. It checks
// its arguments and does no I/O: the first Acquire by any client creates the
// semaphore in Redis, atomically. A client whose size differs from the size
// stored in Redis gets a *SizeMismatchError (ErrSizeMismatch) from Acquire and
// TryAcquire, and nothing changes.
//
// name may hold any bytes (it is encoded before it goes into a key); it must
// not be empty or longer than MaxNameLen. size must be between 1 and MaxSize.
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
	code       int64 // 1 granted, 0 none free, 2 aborted, 3 released
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
	return append(s.k.all(5), s.k.pend(acq),
		s.size, acq, s.cfg.ttl.Milliseconds(), s.cfg.label, blockMs,
		s.cfg.grace.Milliseconds(), s.tombMs(), phase, s.sizeMode())
}

// tombMs is how long an aborted acquisition's tombstone lives: longer than
// any BLMOVE of it can still be registered in Redis.
func (s *Semaphore) tombMs() int64 {
	return (maxBlock + blockSlack + s.cfg.grace).Milliseconds()
}

// blockFor is how long the next BLMOVE may block: at most maxBlock and at
// most what is left of ctx.
func (s *Semaphore) blockFor(ctx context.Context) int64 {
	d := time.Duration(s.maxBlock.Load())
	if dl, ok := ctx.Deadline(); ok {
		if rem := time.Until(dl); rem < d {
			d = rem
		}
	}
	if d < minBlock {
		d = minBlock
	}
	return d.Milliseconds()
}

// maxStaleGrants bounds how many grants in a row an acquisition gives back
// because they reached it after their lease's local deadline.
const maxStaleGrants = 3

// maxBrokenWaits bounds how many times in a row Acquire starts over after its
// blocked connection broke before it gives up and returns the error.
const maxBrokenWaits = 5

// acquireMode says how far one acquisition goes.
type acquireMode int

const (
	modeTry      acquireMode = iota // the fast path only: ErrNoToken when none is free
	modeRegister                    // the fast path; when none is free, stay registered as waiting and return that
	modeWait                        // wait until a grant or ctx's end
)

// acquireStart is an acquisition whose fast path already ran and found no
// token: registered as waiting in Redis, ready for its first BLMOVE.
type acquireStart struct {
	acq  string
	r    acquireReply
	sent int64
}

func (s *Semaphore) acquire(ctx context.Context, wait bool) (*Lease, error) {
	mode := modeTry
	if wait {
		mode = modeWait
	}
	l, _, err := s.acquireFrom(ctx, mode, nil)
	return l, err
}

// acquireFrom runs an acquisition in mode, continuing start if given.
func (s *Semaphore) acquireFrom(ctx context.Context, mode acquireMode, start *acquireStart) (*Lease, *acquireStart, error) {
	if err := ctx.Err(); err != nil {
		if start != nil {
			s.settle(ctx, start.acq)
		}
		return nil, nil, s.ctxError(err)
	}
	pool := s.pool
	if mode == modeWait {
		pool = s.block
	}
	broken := 0
	for {
		conn, err := pool.GetContext(ctx)
		if err != nil {
			if start != nil {
				s.settle(ctx, start.acq)
			}
			if err := ctxErr(ctx); err != nil {
				return nil, nil, s.ctxError(err)
			}
			return nil, nil, fmt.Errorf("redsem: acquire semaphore %q: %w", printable(s.name), err)
		}
		l, reg, err := s.acquireOn(ctx, conn, mode, start)
		start = nil
		conn.Close()
		var be *brokenWait
		if !errors.As(err, &be) {
			return l, reg, err
		}
		if broken++; broken >= maxBrokenWaits {
			return nil, nil, fmt.Errorf("redsem: acquire semaphore %q: %w", printable(s.name), be.err)
		}
	}
}

// brokenWait reports that the blocked connection broke while ctx was still
// live and the acquisition was settled without a grant: start over.
type brokenWait struct{ err error }

func (e *brokenWait) Error() string { return e.err.Error() }

// acquireOn runs one acquisition on conn: the fast path (unless start says
// it ran), then, in modeWait, blocking waits until a grant, ctx's end, or a
// broken connection.
func (s *Semaphore) acquireOn(ctx context.Context, conn redis.Conn, mode acquireMode, start *acquireStart) (*Lease, *acquireStart, error) {
	var (
		acq  string
		r    acquireReply
		err  error
		sent int64
	)
	if start != nil {
		acq, r, sent = start.acq, start.r, start.sent
	} else {
		acq = newAcqID()
		var block int64
		switch mode {
		case modeWait:
			block = s.blockFor(ctx)
		case modeRegister:
			block = s.maxBlock.Load() / int64(time.Millisecond)
		}
		sent = monoNow()
		failpoint.Hit("acquire.sent")
		r, err = parseAcquireReply(runScript(ctx, conn, acquireScript, s.acquireArgs(acq, block, "fresh")...))
	}
	var blockLeft time.Duration
	stale := 0 // grants in a row that were unusable on arrival
	for {
		if err != nil {
			if r, err = s.failedAcquire(ctx, acq, err, blockLeft); err != nil {
				return nil, nil, err
			}
		}
		s.clock.observe(sent, r.nowUs)
		switch r.code {
		case 1:
			failpoint.Hit("acquire.granted")
			l := s.newLease(acq, r, sent)
			if l.Valid() {
				return l.use(), nil, nil
			}
			// The grant is older than our view of its lease allows (this
			// process was frozen while Redis handed it the token): never use
			// it. Give it back if it is still ours, and wait again, but not
			// forever: grants that keep arriving too late would loop.
			s.giveBack(ctx, l)
			if stale++; stale >= maxStaleGrants {
				return nil, nil, fmt.Errorf("%w: semaphore %q: %d grants in a row were past their local deadline on arrival (TTL %v)",
					ErrStaleGrant, printable(s.name), stale, s.cfg.ttl)
			}
			acq = newAcqID()
		case 2, 3:
			acq = newAcqID()
		case 0:
			stale = 0
			switch mode {
			case modeTry:
				return nil, nil, fmt.Errorf("%w: semaphore %q", ErrNoToken, printable(s.name))
			case modeRegister:
				return nil, &acquireStart{acq: acq, r: r, sent: sent}, nil
			}
		}
		if err := ctxErr(ctx); err != nil {
			if r.code == 0 {
				// The script registered this acquisition as waiting: take
				// the registration back rather than leave it to the sweep.
				s.settle(ctx, acq)
			}
			return nil, nil, s.ctxError(err)
		}
		if r.code == 0 && monoNow()-sent >= (r.blockMs+s.cfg.grace.Milliseconds())*1000 {
			// This process came back too late to wait on the registration
			// the reply made: Redis may have swept it, and a BLMOVE now
			// would move a token into a pending list only the sweep's
			// tombstone still covers. Register again (a tombstone turns the
			// call into "aborted", and a new acquisition follows).
			r.code = 3
		}
		sent = monoNow()
		if r.code != 0 {
			blockLeft = 0
			r, err = parseAcquireReply(runScript(ctx, conn, acquireScript, s.acquireArgs(acq, s.blockFor(ctx), "fresh")...))
			continue
		}
		used, started := time.Duration(r.blockMs)*time.Millisecond, time.Now()
		r, err = s.blockOnce(ctx, conn, acq, r.blockMs)
		blockLeft = used - time.Since(started)
	}
}

// blockOnce writes BLMOVE and acquire.lua in one write: when a token reaches
// this waiter, Redis runs the script right behind the BLMOVE and the lease is
// recorded before the client reads a byte (see doc.go, Model). Returns the
// script's reply.
func (s *Semaphore) blockOnce(ctx context.Context, conn redis.Conn, acq string, blockMs int64) (acquireReply, error) {
	next := s.blockFor(ctx)
	args := s.acquireArgs(acq, next, "wait")
	secs := strconv.FormatFloat(float64(blockMs)/1000, 'f', 3, 64)
	if err := conn.Send("BLMOVE", s.k.tokens, s.k.pend(acq), "LEFT", "RIGHT", secs); err != nil {
		return acquireReply{}, err
	}
	skip := failpoint.Hit("wait.script")
	if !skip {
		if err := acquireScript.SendHash(conn, args...); err != nil {
			return acquireReply{}, err
		}
	}
	if err := conn.Flush(); err != nil {
		return acquireReply{}, err
	}
	failpoint.Hit("wait.sent")
	rctx, cancel := context.WithTimeout(ctx, time.Duration(blockMs)*time.Millisecond+blockSlack)
	defer cancel()
	_, moveErr := redis.ReceiveContext(conn, rctx)
	if moveErr != nil && !isRedisError(moveErr) {
		return acquireReply{}, moveErr
	}
	if skip {
		return acquireReply{}, errSkipped
	}
	v, err := redis.ReceiveContext(conn, rctx)
	if re, ok := err.(redis.Error); ok && len(re) >= 8 && string(re[:8]) == "NOSCRIPT" {
		v, err = acquireScript.DoContext(ctx, conn, args...)
	}
	if moveErr != nil {
		return acquireReply{}, &scriptErr{s.scriptError("acquire", moveErr)}
	}
	return parseAcquireReply(v, err)
}

// failedAcquire settles an acquisition whose reply was not read: the script
// may have run and leased a token, or a BLMOVE may still be registered. With
// ctx ended the token goes back and ctx's error is returned. Otherwise a lease
// that was granted is kept (the grant is returned), and without one a
// *brokenWait tells acquire to start over on a fresh connection.
func (s *Semaphore) failedAcquire(ctx context.Context, acq string, err error, blockLeft time.Duration) (acquireReply, error) {
	if isRedisError(err) {
		// The script refused (size mismatch, wrong type, OOM...). Behind a
		// BLMOVE a token may already sit in our pending list: give it back
		// now rather than at the pending sweep.
		s.settle(ctx, acq)
		return acquireReply{}, s.scriptError("acquire", err)
	}
	var se *scriptErr
	if errors.As(err, &se) {
		s.settle(ctx, acq)
		return acquireReply{}, se.err
	}
	if ctxErr(ctx) == nil {
		rctx, cancel := context.WithTimeout(ctx, settleTimeout)
		r, aerr := s.abort(rctx, acq, "resolve")
		cancel()
		switch {
		case aerr == nil && r.code == 1:
			return r, nil
		case aerr == nil:
			s.fitBlock(err, blockLeft)
			return acquireReply{}, &brokenWait{err}
		case ctxErr(ctx) == nil:
			return acquireReply{}, fmt.Errorf("redsem: acquire semaphore %q: %w (settling it failed too: %v)", printable(s.name), err, aerr)
		}
	}
	s.settle(ctx, acq)
	return acquireReply{}, s.ctxError(ctxErr(ctx))
}

// settle gives back whatever acquisition acq may hold. It waits for that
// briefly, so that normally the semaphore is settled when the caller
// returns, but never holds the caller long (its context may have ended)
// against a server that does not answer: the settle goes on in the
// background for at most settleTimeout.
func (s *Semaphore) settle(ctx context.Context, acq string) {
	done := make(chan struct{})
	clk.Go(func() {
		defer close(done)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		_, _ = s.abort(actx, acq, "release")
	})
	clk.WaitOrDone(context.Background(), done, settleWait)
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

// fitBlock halves the longest block when a wait broke with err on the
// connection's read deadline well before the wait's own timeout (blockLeft
// was left of it): that connection's read timeout is shorter than our block.
func (s *Semaphore) fitBlock(err error, blockLeft time.Duration) {
	var ne net.Error
	if blockLeft > time.Second && errors.As(err, &ne) && ne.Timeout() {
		if cur := time.Duration(s.maxBlock.Load()); cur > time.Second {
			s.maxBlock.Store(int64(cur / 2))
		}
	}
}

// settleTimeout bounds settling an acquisition whose reply was lost;
// settleWait is how long a cancelled Acquire waits for that before it
// returns.
const (
	settleTimeout = engine.SettleTimeout
	settleWait    = engine.SettleWait
)

// errSkipped is what a wait whose script a failpoint skipped reports.
var errSkipped = errors.New("redsem: failpoint skipped the lease script")

// scriptErr carries an error already mapped by scriptError.
type scriptErr struct{ err error }

func (e *scriptErr) Error() string { return e.err.Error() }

// abort runs abort.lua for acq in the given mode ("release" or "resolve").
func (s *Semaphore) abort(actx context.Context, acq, mode string) (acquireReply, error) {
	sent := monoNow()
	args := append(s.k.all(5), s.k.pend(acq), acq, mode, s.tombMs())
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

// Reclaim gives back the tokens of every expired lease and of pending lists
// whose waiter never confirmed, and returns how many tokens it put back.
// Every Acquire does the same, and blocked waiters wake for it at the
// earliest lease deadline, so calling Reclaim is never required. Like Status
// and Delete it uses the size stored in Redis, not the one this Semaphore
// was made with; an Admin (NewAdmin) does the same without any size.
func (s *Semaphore) Reclaim(ctx context.Context) (int, error) {
	v, _, err := s.call(ctx, reclaimScript, append(s.k.all(5), 1000)...)
	n, err := redis.Int(v, err)
	if err != nil {
		return 0, s.scriptError("reclaim", err)
	}
	if o := s.cfg.observer; o != nil && n > 0 {
		o.Reclaimed(s.name, n)
	}
	return n, nil
}

// Delete removes every key of the semaphore. Holders find out on their next
// Refresh or Release (ErrLeaseLost); the next Acquire creates the semaphore
// afresh, with a new epoch, so no token of the old one is ever accepted.
// Blocked waiters keep waiting and are served by the new semaphore.
func (s *Semaphore) Delete(ctx context.Context) error {
	if _, _, err := s.call(ctx, deleteScript, s.k.all(5)...); err != nil {
		return s.scriptError("delete", err)
	}
	return nil
}
