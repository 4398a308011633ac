package admin

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redsem/redsem/internal/engine"
)

// Counters is a redsem.Observer (and a redsem.RefreshObserver) that counts,
// with atomic counters safe to read at any time; pass it with
// redsem.WithObserver. A rate gate's starts count as Acquired but are never
// released: give a rate.Gate a Counters of its own, or Holding means
// nothing. String prints JSON, so a *Counters can be published with
// expvar.Publish. The zero value is ready to use.
type Counters struct {
	acquired, busy, timeouts, cancels, failures atomic.Int64
	released, lost, refreshFailures             atomic.Int64
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
	RefreshFailures int64         // failed background refreshes
	Holding         int64         // leases of this process held now (Acquired - Released - Lost)
	WaitTotal       time.Duration // time spent in successful acquisitions
	HoldTotal       time.Duration // time leases were held, until released or lost
}

// Acquired counts a lease granted after wait (redsem.Observer).
func (c *Counters) Acquired(_ string, wait time.Duration) {
	c.acquired.Add(1)
	c.waitNs.Add(int64(wait))
}

// AcquireFailed counts a failed acquisition by its cause: busy (none free,
// or rate limited), a timeout, a cancellation, or another failure
// (redsem.Observer).
func (c *Counters) AcquireFailed(_ string, _ time.Duration, err error) {
	switch {
	case errors.Is(err, engine.ErrNoToken), errors.Is(err, engine.ErrRateLimited):
		c.busy.Add(1)
	case errors.Is(err, context.DeadlineExceeded):
		c.timeouts.Add(1)
	case errors.Is(err, context.Canceled):
		c.cancels.Add(1)
	default:
		c.failures.Add(1)
	}
}

// Released counts a lease released after held (redsem.Observer).
func (c *Counters) Released(_ string, held time.Duration) {
	c.released.Add(1)
	c.holdNs.Add(int64(held))
}

// LeaseLost counts a lease that ended without Release (redsem.Observer).
func (c *Counters) LeaseLost(_ string, held time.Duration, _ error) {
	c.lost.Add(1)
	c.holdNs.Add(int64(held))
}

// RefreshFailed counts a failed background refresh
// (redsem.RefreshObserver).
func (c *Counters) RefreshFailed(string, error) { c.refreshFailures.Add(1) }

// Snapshot reads the counters.
func (c *Counters) Snapshot() CountersSnapshot {
	s := CountersSnapshot{
		Acquired: c.acquired.Load(), Busy: c.busy.Load(), Timeouts: c.timeouts.Load(),
		Cancellations: c.cancels.Load(), Failures: c.failures.Load(),
		Released: c.released.Load(), Lost: c.lost.Load(),
		RefreshFailures: c.refreshFailures.Load(),
		WaitTotal:       time.Duration(c.waitNs.Load()), HoldTotal: time.Duration(c.holdNs.Load()),
	}
	s.Holding = s.Acquired - s.Released - s.Lost
	return s
}

// String prints the counters as JSON (durations in seconds).
func (c *Counters) String() string {
	s := c.Snapshot()
	return fmt.Sprintf(`{"acquired":%d,"busy":%d,"timeouts":%d,"cancellations":%d,"failures":%d,"released":%d,"lost":%d,"refresh_failures":%d,"holding":%d,"wait_seconds":%g,"hold_seconds":%g}`,
		s.Acquired, s.Busy, s.Timeouts, s.Cancellations, s.Failures, s.Released, s.Lost, s.RefreshFailures, s.Holding,
		s.WaitTotal.Seconds(), s.HoldTotal.Seconds())
}
