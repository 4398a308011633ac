package redsem

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// Shared waiting. Goroutines that wait on the same Semaphore queue up in
// this process, first come, first served, behind a few blocking Redis calls
// (one by default: WithWaitConnections). Each such call, a pump, runs the
// ordinary acquire protocol (fast path, then BLMOVE and the lease script in
// one write) on its own connection and hands every lease it is granted to
// the goroutine at the head of the queue. A thousand goroutines waiting on
// one semaphore therefore hold one connection, not a thousand.
//
// A waiter whose context ends leaves the queue with no round trip. A lease
// that reaches a waiter that has just left is handed to the next one, or
// released when nobody is left. When the queue empties, the pumps stop: a
// pump blocked in Redis is cancelled, which settles its acquisition as any
// cancelled Acquire does (the token, if Redis handed one over, goes back).
//
// Order: within a process, waiters are served in arrival order. Between
// processes, Redis serves the blocked calls in arrival order, and a pump
// that was served queues again behind the others: processes take turns.

// waitQueue is a Semaphore's local queue of waiting goroutines.
type waitQueue struct {
	mu      sync.Mutex
	waiters list.List // of *waiter, oldest first
	pumps   int       // pumps running
	gen     *pumpGen  // the pumps' current run, cancelled when the queue empties
	// registering: a try is under way that will stay registered in Redis
	// for a pump to go on with (acquireShared).
	registering bool
}

// pumpGen is one run of the pumps, from the first waiter to an empty queue.
// busy counts the acquisitions started under it, so that the waiter that
// empties the queue can wait for them to be settled.
type pumpGen struct {
	ctx    context.Context
	cancel context.CancelFunc
	busy   sync.WaitGroup
}

// waiter is one goroutine in Acquire. ch receives its lease or the error
// that ended the pump serving it; it is buffered, so handing over never
// blocks the pump.
type waiter struct {
	ch   chan waitResult
	elem *list.Element
}

type waitResult struct {
	lease *Lease
	err   error
}

// acquireShared is Acquire with shared waiting.
func (s *Semaphore) acquireShared(ctx context.Context) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.ctxError(err)
	}
	q := &s.q
	q.mu.Lock()
	empty := q.waiters.Len() == 0
	// One try at a time may stay registered for the pump to go on with.
	register := empty && q.pumps == 0 && !q.registering
	q.registering = q.registering || register
	q.mu.Unlock()
	var start *acquireStart
	if empty {
		// Nobody here is waiting: try once, without queueing. (With others
		// queued, a newcomer must not overtake them.) If no token is free,
		// the try that will start the pump leaves its acquisition
		// registered as waiting in Redis, and the pump takes it on from
		// there, with its BLMOVE: no second fast path.
		mode := modeTry
		if register {
			mode = modeRegister
		}
		l, reg, err := s.acquireFrom(ctx, mode, nil)
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
	w := &waiter{ch: make(chan waitResult, 1)}
	q.mu.Lock()
	w.elem = q.waiters.PushBack(w)
	if q.gen == nil || q.gen.ctx.Err() != nil {
		g := &pumpGen{}
		g.ctx, g.cancel = context.WithCancel(context.Background())
		q.gen = g
	}
	if q.pumps < s.cfg.waitConns && q.pumps < q.waiters.Len() {
		q.pumps++
		go s.pump(start)
		start = nil
	}
	q.mu.Unlock()
	if start != nil {
		// A pump already runs: it waits with its own acquisition.
		go s.settle(context.Background(), start.Acq)
	}

	select {
	case r := <-w.ch:
		return r.lease, r.err
	case <-ctx.Done():
	}
	q.mu.Lock()
	if w.elem != nil {
		// Still queued: leave without a round trip.
		q.waiters.Remove(w.elem)
		w.elem = nil
		if q.waiters.Len() > 0 {
			q.mu.Unlock()
			return nil, s.ctxError(ctx.Err())
		}
		// The last one out stops the pumps, and waits (briefly: settleWait)
		// for their waits in Redis to be settled, so that, as with a waiter
		// on its own connection, a returned Acquire leaves nothing behind.
		g := q.gen
		g.cancel()
		q.mu.Unlock()
		settled := make(chan struct{})
		go func() { g.busy.Wait(); close(settled) }()
		t := time.NewTimer(settleWait)
		defer t.Stop()
		select {
		case <-settled:
		case <-t.C:
		}
		return nil, s.ctxError(ctx.Err())
	}
	q.mu.Unlock()
	// Served while leaving: pass the lease on.
	if r := <-w.ch; r.lease != nil {
		s.handOff(r.lease)
	}
	return nil, s.ctxError(ctx.Err())
}

// pump acquires on behalf of the queue until the queue is empty. Whether to
// go on is decided under the queue's lock, together with the count of
// pumps, so a waiter that arrives as a pump leaves always finds one running.
//
// start, if not nil, is the first waiter's try, registered in Redis as
// waiting: the pump goes on with it (straight to BLMOVE) instead of running
// the fast path again.
func (s *Semaphore) pump(start *acquireStart) {
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
		g.busy.Add(1)
		q.mu.Unlock()
		l, _, err := s.acquireFrom(g.ctx, modeWait, start)
		start = nil
		g.busy.Done()
		switch {
		case err == nil:
			s.handOff(l)
		case g.ctx.Err() != nil:
			// The queue emptied while we waited, and acquire gave back
			// anything Redis had handed over. Look again: someone may have
			// come since.
		default:
			// Tell every waiter: each would have met the same error.
			q.mu.Lock()
			for e := q.waiters.Front(); e != nil; e = q.waiters.Front() {
				w := q.waiters.Remove(e).(*waiter)
				w.elem = nil
				w.ch <- waitResult{err: err}
			}
			g.cancel()
			q.mu.Unlock()
		}
	}
}

// handOff gives l to the oldest waiter, or releases it if none is left.
func (s *Semaphore) handOff(l *Lease) {
	q := &s.q
	q.mu.Lock()
	if e := q.waiters.Front(); e != nil && l.Valid() {
		w := q.waiters.Remove(e).(*waiter)
		w.elem = nil
		w.ch <- waitResult{lease: l}
		if q.waiters.Len() == 0 {
			// Served the last one: any other pump still blocked in Redis
			// would wait for nobody (and keep its place in Redis's queue).
			q.gen.cancel()
		}
		q.mu.Unlock()
		return
	}
	q.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	_ = l.Release(ctx)
}

// waitingHere reports how many goroutines wait in this process's queue and
// how many pumps serve them.
func (s *Semaphore) waitingHere() (waiters, pumps int) {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	return s.q.waiters.Len(), s.q.pumps
}

// pumpsIdleWithin waits until no pump runs, for tests and Close-like uses.
func (s *Semaphore) pumpsIdleWithin(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, p := s.waitingHere(); p == 0 {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}
