package redsem

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// The token list's Go half: Acquire and TryAcquire, from the call to Redis
// and back (the list itself: internal/engine/scripts/acquire.lua):
//
//	Acquire ─ shared waiting (default): the first waiter tries once, then a
//	│         pump goroutine waits in Redis for the whole queue (acquireShared)
//	└─ acquire ─ engine.Drive: the loop every acquisition kind shares
//	             ├─ oneToken.First: acquire.lua (acquire_fast.lua first)
//	             ├─ oneToken.Queue: once a wait here, First and Wait in one
//	             │                  write: register.lua, BLMOVE, acquire.lua
//	             ├─ oneToken.Wait:  BLMOVE tokens → pend, acquire.lua behind it
//	             ├─ oneToken.Abort: abort.lua, to settle a lost reply or a cancel
//	             └─ oneToken.Accept: the grant becomes a *Lease (lease.go)
//
// Replies carry Redis TIME, from which the lease's local deadline is
// computed (lease.go, Local deadlines).

// Acquire blocks until a token is free and returns a lease on it, or until
// ctx ends: then errors.Is(err, ctx.Err()) holds and no token is lost.
// Waiters are served first come, first served: in this process behind one
// blocking Redis call (WithWaitConnections), between processes by Redis.
// Other errors: *SizeMismatchError, ErrWrongType, ErrCorrupt,
// ErrOutOfMemory, ErrStaleGrant, or a connection error.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) {
	w := s.watch(ctx, s.role())
	var l *Lease
	var err error
	if s.cfg.waitConns > 0 {
		l, err = s.acquireShared(ctx)
	} else {
		l, _, err = s.acquire(ctx, engine.ModeWait, nil)
	}
	return s.observeAcquire(w, l, err)
}

// TryAcquire returns a lease if a token is free now, and ErrNoToken if none
// is. It never waits for a token: one round trip, a few at most when grants
// arrive past their lease's local deadline (then ErrStaleGrant).
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) {
	w := s.watch(ctx, s.role())
	l, _, err := s.acquire(ctx, engine.ModeTry, nil)
	return s.observeAcquire(w, l, err)
}

// acquire runs an acquisition of one token in mode, going on with
// registration reg if given. In ModeRegister a refusal returns the registration.
func (s *Semaphore) acquire(ctx context.Context, mode engine.Mode, reg *engine.Pending) (*Lease, *engine.Pending, error) {
	p := &oneToken{s: s}
	res, err := engine.Drive(ctx, s.driver(p.fail), p, mode, reg)
	switch {
	case err != nil:
		return nil, nil, err
	case res.Granted:
		return p.lease, nil, nil
	case res.Pending != nil:
		return nil, res.Pending, nil
	}
	return nil, nil, fmt.Errorf("%w: every slot of %q is taken", ErrNoToken, engine.Printable(s.name))
}

// driver is the acquisition driver of s, on s's pools and time source;
// fail maps the protocol's errors.
func (s *Semaphore) driver(fail func(error) error) *engine.Driver {
	return &engine.Driver{Pool: s.pool, Block: s.block, MaxBlock: &s.maxBlock, Grace: s.cfg.grace,
		Observe: s.offset.observeReply, Fail: fail}
}

// oneToken is the protocol of one token: acquire.lua, BLMOVE from the
// token list into the waiter's pending list, abort.lua.
type oneToken struct {
	s     *Semaphore
	lease *Lease
}

func (p *oneToken) First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (engine.Reply, error) {
	sent := engine.Clk.Now()
	r, err := parseAcquireReply(engine.RunScript(ctx, conn, p.s.acquireCall(acq, block, "fresh")))
	p.s.wake.note(sent, block, r, err, true)
	return r, err
}

// Wait writes BLMOVE and acquire.lua in one write: when a token reaches
// this waiter, Redis runs the script right behind the BLMOVE and the lease
// is recorded before the client reads a byte.
func (p *oneToken) Wait(ctx context.Context, conn redis.Conn, acq string, r engine.Reply, next time.Duration) (engine.Reply, error) {
	s := p.s
	sent := engine.Clk.Now()
	r, err := parseAcquireReply(engine.BlockThenRun(ctx, conn, r.Block, engine.BLMOVE(s.k.tokens, s.k.pend(acq)),
		s.acquireCall(acq, next, "wait")))
	s.wake.note(sent, next, r, err, false)
	return r, err
}

// Queue is an acquisition's first call and its wait in one write, once an
// acquisition of s here waited and Redis's last answer said when the
// earliest lease is due: register.lua, BLMOVE until then, acquire.lua
// behind it. Contended, an acquire and release are two round trips.
func (p *oneToken) Queue(ctx context.Context, conn redis.Conn, acq string) (engine.Reply, bool, error) {
	s := p.s
	sent := engine.Clk.Now()
	block, ok := s.wake.until(sent, s.driver(p.fail).BlockFor(ctx))
	if !ok {
		return engine.Reply{}, false, nil
	}
	size := strconv.Itoa(s.size)
	if s.cfg.adoptSize {
		size = ""
	}
	reg := engine.Register.With([]interface{}{s.k.meta, s.k.tokens, s.k.waits}, engine.RegisterArgs{
		Size: size, AcqID: acq, BlockMs: block.Milliseconds(), GraceMs: s.cfg.grace.Milliseconds()})
	free := false
	registered := func(v interface{}) bool {
		vals, err := redis.Int64s(v, nil)
		if err != nil || len(vals) < 2 || vals[0] != 1 {
			return false
		}
		free = vals[1] > 0
		return true
	}
	r, err := parseAcquireReply(engine.QueueThenRun(ctx, conn, reg, registered,
		block, engine.BLMOVE(s.k.tokens, s.k.pend(acq)), s.acquireCall(acq, block, "wait")))
	switch {
	case errors.Is(err, engine.ErrNotQueued), free:
		s.wake.forget() // start with First next time
	default:
		s.wake.note(sent, block, r, err, false)
	}
	return r, true, err
}

func (p *oneToken) Abort(ctx context.Context, acq, mode string) (engine.Reply, error) {
	s := p.s
	v, _, err := engine.Call(ctx, s.pool, engine.Abort.With(append(s.k.all(5), s.k.pend(acq)),
		engine.AbortArgs{AcqID: acq, Mode: mode, TombMs: s.tombMs()}))
	return parseAcquireReply(v, err)
}

// Accept takes a grant, unless this process was frozen while Redis handed
// it over and the lease's local deadline has passed: such a grant is given
// back, never used.
func (p *oneToken) Accept(ctx context.Context, acq string, r engine.Reply, sent time.Time) bool {
	p.lease = p.s.takeGrant(ctx, acq, r, sent)
	return p.lease != nil
}

// takeGrant turns grant r of acquisition acq into a lease, or gives it
// back and returns nil when its local deadline has passed already.
func (s *Semaphore) takeGrant(ctx context.Context, acq string, r engine.Reply, sent time.Time) *Lease {
	l := s.newLease(acq, r, monoUs(sent))
	if !l.Valid() {
		s.returnGrant(ctx, l)
		return nil
	}
	return l.use()
}

func (p *oneToken) fail(err error) error {
	if engine.IsRedisError(err) {
		return p.s.scriptError("acquire", err)
	}
	return p.s.ctxError(err)
}

// acquireCall is acquire.lua's call. phase is "fresh" for an acquisition's
// first call and "wait" behind its BLMOVE.
func (s *Semaphore) acquireCall(acq string, block time.Duration, phase string) engine.Run {
	args := engine.AcquireArgs{Size: s.size, AcqID: acq, TTLMs: s.cfg.ttl.Milliseconds(), Label: s.cfg.label,
		BlockMs: block.Milliseconds(), GraceMs: s.cfg.grace.Milliseconds(), TombMs: s.tombMs(), Phase: phase,
		IdleMs: s.cfg.idle.Milliseconds()}
	if s.cfg.adoptSize {
		args.SizeMode = "adopt"
	}
	return engine.Acquire.With(append(s.k.all(5), s.k.pend(acq)), args)
}

// parseAcquireReply decodes a reply of acquire.lua, abort.lua or their
// read-write lock twins: {1, token, fence, deadlineMs, nowUs} granted,
// {code, blockMs, nowUs} otherwise.
func parseAcquireReply(v interface{}, err error) (engine.Reply, error) {
	vals, err := redis.Values(v, err)
	if err != nil {
		return engine.Reply{}, err
	}
	var r engine.Reply
	var tok string
	var blockMs int64
	switch len(vals) {
	case 5:
		_, err = redis.Scan(vals, &r.Code, &tok, &r.Fence, &r.DeadlineMs, &r.NowUs)
		r.Tokens = []string{tok}
	case 3:
		_, err = redis.Scan(vals, &r.Code, &blockMs, &r.NowUs)
		r.Block, r.Moves = time.Duration(blockMs)*time.Millisecond, true
	default:
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	return r, err
}

// tombMs is how long an aborted acquisition's tombstone lives: longer than
// any BLMOVE of it can still be registered in Redis.
func (s *Semaphore) tombMs() int64 {
	return (engine.MaxBlock + engine.BlockSlack + s.cfg.grace).Milliseconds()
}

// settle gives back whatever acquisition acq may hold (engine.Settle).
func (s *Semaphore) settle(ctx context.Context, acq string) {
	p := &oneToken{s: s}
	engine.Settle(ctx, s.driver(p.fail), p, acq)
}

// returnGrant releases a grant the acquisition will not use. After ctx has
// ended it waits engine.SettleWait at most; the release goes on in the
// background (bounded by releaseTimeout).
func (s *Semaphore) returnGrant(ctx context.Context, l *Lease) {
	done := make(chan struct{})
	engine.Clk.Go(func() {
		defer close(done)
		_ = l.Release(ctx)
	})
	engine.Clk.WaitOrDone(ctx, done, releaseTimeout+time.Second)
	if ctx.Err() != nil {
		engine.Clk.WaitOrDone(context.Background(), done, engine.SettleWait)
	}
}

func (s *Semaphore) ctxError(err error) error {
	return fmt.Errorf("redsem: acquire %s %q: %w", s.leaseKind().what, engine.Printable(s.name), err)
}

// Shared waiting (WithWaitConnections, on by default). Goroutines that wait
// on the same Semaphore queue up in this process, first come, first served,
// behind a few pumps: each pump runs the ordinary acquisition in ModeWait on
// its own connection and hands every lease it is granted to the goroutine
// at the head of the queue. A thousand waiting goroutines hold one
// connection, not a thousand. Between processes, Redis serves the pumps in
// arrival order, and a pump that was served queues again behind the others.
//
// A waiter whose context ends leaves the queue with no round trip (one
// served as its context ends keeps what it was served). A lease that
// reaches the queue once its waiters have left goes back to Redis. When the
// queue empties, the pumps' acquisitions are cancelled, which settles them
// as any cancelled Acquire. Every wait goes through engine.Clk.

// waitQueue is a Semaphore's local queue of waiting goroutines.
type waitQueue struct {
	mu      sync.Mutex
	waiters list.List // of *waiter, oldest first
	pumps   int       // pumps running
	gen     *pumpGen  // the pumps' current run, cancelled when the queue empties
	// registering: a try is under way that will stay registered in Redis
	// for a pump to go on with.
	registering bool
}

// pumpGen is one run of the pumps, from the first waiter to an empty queue.
// busy counts the acquisitions under way under it; settled is closed once
// it is cancelled and none is, so that the waiter that empties the queue
// can wait for them to be settled. Both with the queue's lock.
type pumpGen struct {
	ctx     context.Context
	cancel  context.CancelFunc
	busy    int
	settled chan struct{}
	closed  bool // settled is closed
}

func newPumpGen() *pumpGen {
	g := &pumpGen{settled: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g
}

// stop cancels g's acquisitions, and done ends one; closeIfSettled closes
// settled once g is cancelled and none runs (none starts after the cancel).
func (g *pumpGen) stop() { g.cancel(); g.closeIfSettled() }

func (g *pumpGen) done() { g.busy--; g.closeIfSettled() }

func (g *pumpGen) closeIfSettled() {
	if g.busy == 0 && g.ctx.Err() != nil && !g.closed {
		g.closed = true
		close(g.settled)
	}
}

// waiter is one goroutine in Acquire. serve sets res and closes done, so
// handing over never blocks a pump.
type waiter struct {
	done chan struct{}
	res  waitResult
	elem *list.Element
}

type waitResult struct {
	lease *Lease
	err   error
}

// serve gives w its result, once w is out of the queue (q.mu held).
func (w *waiter) serve(r waitResult) {
	w.elem, w.res = nil, r
	close(w.done)
}

// acquireShared is Acquire with shared waiting.
func (s *Semaphore) acquireShared(ctx context.Context) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.ctxError(err)
	}
	q := &s.q
	// Once a wait here found no token free, the next goes straight to the
	// queue, where the pump writes its registration with its wait.
	_, queued := s.wake.until(engine.Clk.Now(), engine.MaxBlock)
	q.mu.Lock()
	empty := q.waiters.Len() == 0 && !queued
	// One try at a time may stay registered for the pump to go on with.
	register := empty && q.pumps == 0 && !q.registering
	q.registering = q.registering || register
	q.mu.Unlock()
	var start *engine.Pending
	if empty {
		// Nobody here waits: try once, without queueing (with others
		// queued, a newcomer must not overtake them). The try that will
		// start the pump stays registered in Redis when no token is free,
		// and the pump goes on from there, straight to its BLMOVE.
		mode := engine.ModeTry
		if register {
			mode = engine.ModeRegister
		}
		l, reg, err := s.acquire(ctx, mode, nil)
		if register {
			q.mu.Lock()
			q.registering = false
			q.mu.Unlock()
		}
		if l != nil || (err != nil && !errors.Is(err, ErrNoToken)) {
			return l, err
		}
		start = reg
	}
	w := &waiter{done: make(chan struct{})}
	q.mu.Lock()
	w.elem = q.waiters.PushBack(w)
	if q.gen == nil || q.gen.ctx.Err() != nil {
		q.gen = newPumpGen()
	}
	if q.pumps < s.cfg.waitConns && q.pumps < q.waiters.Len() {
		q.pumps++
		pumpStart := start
		engine.Clk.Go(func() { s.pump(pumpStart) })
		start = nil
	}
	q.mu.Unlock()
	if start != nil {
		// A pump already runs: it waits with its own acquisition.
		engine.Clk.Go(func() { s.settle(context.Background(), start.Acq) })
	}

	engine.Clk.WaitOrDone(ctx, w.done, engine.Forever)
	q.mu.Lock()
	if w.elem == nil {
		// Served, or told of the pumps' error, maybe as ctx ended.
		r := w.res
		q.mu.Unlock()
		return r.lease, r.err
	}
	// ctx ended: leave without a round trip.
	q.waiters.Remove(w.elem)
	w.elem = nil
	if q.waiters.Len() > 0 {
		q.mu.Unlock()
		return nil, s.ctxError(ctx.Err())
	}
	// The last one out stops the pumps and waits (SettleWait at most) for
	// their acquisitions to be settled, so that, as on a connection of its
	// own, a returned Acquire leaves nothing behind.
	g := q.gen
	g.stop()
	q.mu.Unlock()
	engine.Clk.WaitOrDone(context.Background(), g.settled, engine.SettleWait)
	return nil, s.ctxError(ctx.Err())
}

// pump acquires on behalf of the queue until the queue is empty. Whether to
// go on is decided under the queue's lock, together with the count of
// pumps, so a waiter that arrives as a pump leaves always finds one running.
// start, if not nil, is the first waiter's registration in Redis.
func (s *Semaphore) pump(start *engine.Pending) {
	q := &s.q
	for {
		q.mu.Lock()
		if q.waiters.Len() == 0 {
			q.pumps--
			q.mu.Unlock()
			if start != nil {
				s.settle(context.Background(), start.Acq)
			}
			return
		}
		g := q.gen
		g.busy++
		q.mu.Unlock()
		l, _, err := s.acquire(g.ctx, engine.ModeWait, start)
		start = nil
		q.mu.Lock()
		g.done()
		if err != nil && g.ctx.Err() == nil {
			// Tell every waiter: each would have met the same error.
			for e := q.waiters.Front(); e != nil; e = q.waiters.Front() {
				q.waiters.Remove(e).(*waiter).serve(waitResult{err: err})
			}
			g.stop()
		}
		q.mu.Unlock()
		if err == nil {
			s.handOff(l)
		}
		// Else, with g cancelled, the queue emptied while we waited, and
		// whatever Redis had handed over went back. Look again: someone
		// may have come.
	}
}

// handOff gives l to the oldest waiter, or releases it if none is left.
func (s *Semaphore) handOff(l *Lease) {
	q := &s.q
	q.mu.Lock()
	if e := q.waiters.Front(); e != nil && l.Valid() {
		q.waiters.Remove(e).(*waiter).serve(waitResult{lease: l})
		if q.waiters.Len() == 0 {
			// Served the last one: any other pump still blocked in Redis
			// would wait for nobody (and keep its place in Redis's queue).
			q.gen.stop()
		}
		q.mu.Unlock()
		return
	}
	q.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), engine.SettleTimeout)
	defer cancel()
	_ = l.Release(ctx)
}

// wakeHint is when, by this process's clock, a Semaphore's waiter should
// wake at the latest to reclaim an expired lease: the block of Redis's
// last answer that found no token free, from when it was asked. Set, the
// next Acquire writes its registration with its wait (oneToken.Queue);
// zero, it starts with acquire.lua alone. A grant that waited for nothing
// clears it.
type wakeHint struct{ at atomic.Int64 } // engine.Clk µs (monoUs); 0: none

// note keeps what reply r of a call sent at sent, that could block up to
// block, says: when to wake, from a wait's answer; nothing, from a first
// call's grant (no wait was needed) or a broken connection (Redis may have
// restarted or failed over since).
func (h *wakeHint) note(sent time.Time, block time.Duration, r engine.Reply, err error, first bool) {
	switch {
	case err != nil && !engine.IsRedisError(err):
		h.forget() // a broken connection: what Redis said may be stale
	case err != nil:
	case r.Code == engine.CodeWaiting && block > 0 && r.Block > 0:
		h.at.Store(monoUs(sent.Add(r.Block)))
	case r.Code == engine.CodeGranted && first:
		h.forget()
	}
}

// until returns how long a queued wait started at now may block: until
// the hint, at most max; false without a hint at least MinBlock ahead.
func (h *wakeHint) until(now time.Time, max time.Duration) (time.Duration, bool) {
	at := h.at.Load()
	if at == 0 {
		return 0, false
	}
	left := time.Duration(at-monoUs(now)) * time.Microsecond
	if left < engine.MinBlock {
		return 0, false
	}
	return min(left, max), true
}

func (h *wakeHint) forget() { h.at.Store(0) }
