package redsem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redsem/redsem/internal/engine"
)

// Observer receives a Semaphore's events, for metrics. Its
// methods run on the goroutine that caused the event and must be fast and
// safe for concurrent use. Counters is a ready-made Observer; an adapter to
// Prometheus or OpenTelemetry is a few lines (see docs/metrics.md). An Observer
// that also implements RefreshObserver hears of failed background
// refreshes.
//
// Every acquisition of a Semaphore (Acquire, TryAcquire, AcquireN,
// TryAcquireN, and a Mutex's Lock and TryLock) reports Acquired or
// AcquireFailed, and every lease granted reports its end, Released or
// LeaseLost. A rate gate (package rate) takes a rate.Observer, which needs
// only Acquired and AcquireFailed, so any Observer (Counters included) serves
// there too; give a gate and a semaphore of the same name distinct Observers
// to tell their events apart.
type Observer interface {
	// Acquired reports a lease granted after wait.
	Acquired(name string, wait time.Duration)
	// AcquireFailed reports an acquisition that returned err after wait:
	// ErrNoToken (none free) or rate.ErrRateLimited (a rate gate's Allow), the context's error
	// (a timeout or a cancellation), or another failure.
	AcquireFailed(name string, wait time.Duration, err error)
	// Released reports a lease released after being held for held.
	Released(name string, held time.Duration)
	// LeaseLost reports a lease that ended without Release after being held
	// for held: cause is ErrLeaseExpired or ErrLeaseLost.
	LeaseLost(name string, held time.Duration, cause error)
	// Reclaimed reports tokens of expired leases put back by Reclaim.
	Reclaimed(name string, n int)
}

// RefreshObserver is an Observer that also hears of failed background
// refreshes (auto-refresh, the default for leases). Counters implements it.
type RefreshObserver interface {
	Observer
	// RefreshFailed reports a background refresh of a lease of semaphore
	// name that failed with err: a connection or server error (the refresh
	// is retried until the lease's local deadline, then the lease ends with
	// ErrLeaseExpired), or ErrLeaseLost (Redis no longer records the
	// lease). LeaseLost follows once the lease ends.
	RefreshFailed(name string, err error)
}

// observeRefreshFailed reports a failed background refresh of l.
func (l *Lease) observeRefreshFailed(err error) {
	if ro, ok := l.sem.cfg.observer.(RefreshObserver); ok {
		ro.RefreshFailed(l.sem.name, err)
	}
}

// Counters is an Observer (and a RefreshObserver) that counts, with atomic
// counters safe to read at any time. A rate gate's starts count as Acquired
// but are never released: give a rate.Gate a Counters of its own, or Holding
// means nothing. Its String method prints JSON, so a *Counters can be published
// with expvar.Publish.
type Counters struct {
	acquired, busy, timeouts, cancels, failures atomic.Int64
	released, lost, reclaimed, refreshFailures  atomic.Int64
	waitNs, holdNs                              atomic.Int64
}

// CountersSnapshot is a consistent-enough reading of Counters.
type CountersSnapshot struct {
	Acquired        int64         // leases granted
	Busy            int64         // TryAcquire calls that found no token, Allow calls refused
	Timeouts        int64         // Acquire calls whose context's deadline passed
	Cancellations   int64         // Acquire calls whose context was cancelled
	Failures        int64         // other failed acquisitions
	Released        int64         // leases released
	Lost            int64         // leases that expired or were lost
	Reclaimed       int64         // tokens put back by Reclaim
	RefreshFailures int64         // failed background refreshes
	Holding         int64         // leases of this process held now (Acquired - Released - Lost)
	WaitTotal       time.Duration // time spent in successful acquisitions
	HoldTotal       time.Duration // time leases were held, until released or lost
}

// Acquired implements Observer.
func (c *Counters) Acquired(_ string, wait time.Duration) {
	c.acquired.Add(1)
	c.waitNs.Add(int64(wait))
}

// AcquireFailed implements Observer.
func (c *Counters) AcquireFailed(_ string, _ time.Duration, err error) {
	switch {
	case errors.Is(err, ErrNoToken), errors.Is(err, engine.ErrRateLimited):
		c.busy.Add(1)
	case errors.Is(err, context.DeadlineExceeded):
		c.timeouts.Add(1)
	case errors.Is(err, context.Canceled):
		c.cancels.Add(1)
	default:
		c.failures.Add(1)
	}
}

// Released implements Observer.
func (c *Counters) Released(_ string, held time.Duration) {
	c.released.Add(1)
	c.holdNs.Add(int64(held))
}

// LeaseLost implements Observer.
func (c *Counters) LeaseLost(_ string, held time.Duration, _ error) {
	c.lost.Add(1)
	c.holdNs.Add(int64(held))
}

// Reclaimed implements Observer.
func (c *Counters) Reclaimed(_ string, n int) { c.reclaimed.Add(int64(n)) }

// RefreshFailed implements RefreshObserver.
func (c *Counters) RefreshFailed(string, error) { c.refreshFailures.Add(1) }

// Snapshot reads the counters.
func (c *Counters) Snapshot() CountersSnapshot {
	s := CountersSnapshot{
		Acquired: c.acquired.Load(), Busy: c.busy.Load(), Timeouts: c.timeouts.Load(),
		Cancellations: c.cancels.Load(), Failures: c.failures.Load(),
		Released: c.released.Load(), Lost: c.lost.Load(), Reclaimed: c.reclaimed.Load(),
		RefreshFailures: c.refreshFailures.Load(),
		WaitTotal:       time.Duration(c.waitNs.Load()), HoldTotal: time.Duration(c.holdNs.Load()),
	}
	s.Holding = s.Acquired - s.Released - s.Lost
	return s
}

// String prints the counters as JSON (durations in seconds).
func (c *Counters) String() string {
	s := c.Snapshot()
	return fmt.Sprintf(`{"acquired":%d,"busy":%d,"timeouts":%d,"cancellations":%d,"failures":%d,"released":%d,"lost":%d,"reclaimed":%d,"refresh_failures":%d,"holding":%d,"wait_seconds":%g,"hold_seconds":%g}`,
		s.Acquired, s.Busy, s.Timeouts, s.Cancellations, s.Failures, s.Released, s.Lost, s.Reclaimed, s.RefreshFailures, s.Holding,
		s.WaitTotal.Seconds(), s.HoldTotal.Seconds())
}
