package redsem

import (
	"context"
	"time"

	"github.com/redsem/redsem/internal/engine"
)

// Test-only access to the package's internals.

// abort runs abort.lua for acq in mode ("release" or "resolve").
func (s *Semaphore) abort(ctx context.Context, acq, mode string) (engine.Reply, error) {
	return (&oneToken{s: s}).Abort(ctx, acq, mode)
}

// waitingHere reports how many goroutines wait in this process's queue and
// how many pumps serve them.
func (s *Semaphore) waitingHere() (waiters, pumps int) {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	return s.q.waiters.Len(), s.q.pumps
}

// pumpsIdleWithin waits until no pump runs, d at most.
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

// abortN runs abort_n.lua for a weighted acquisition acq of k tokens.
func (s *Semaphore) abortN(ctx context.Context, acq string, k int, mode string) (engine.Reply, error) {
	return (&kTokens{s: s, k: k}).Abort(ctx, acq, mode)
}
