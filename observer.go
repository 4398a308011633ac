package redsem

import (
	"time"
)

// Observer receives a Semaphore's events, for metrics. Its methods must be
// fast and safe for concurrent use: Acquired and AcquireFailed run on the
// acquiring goroutine, Released and LeaseLost on a goroutine of their own
// once the lease has ended, maybe after Release returned. admin.Counters is a ready-made Observer; an adapter to
// Prometheus or OpenTelemetry is a few lines (see docs/metrics.md). An Observer
// that also implements RefreshObserver hears of failed background
// refreshes.
//
// Every acquisition of a Semaphore (Acquire, TryAcquire, AcquireN,
// TryAcquireN, and a Mutex's Lock and TryLock) reports Acquired or
// AcquireFailed, and every lease granted reports its end, Released or
// LeaseLost. A rate gate (package rate) takes a rate.Observer, which needs
// only Acquired and AcquireFailed, so any Observer (admin.Counters included) serves
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
	// LeaseLost reports a lease that ended without a successful Release
	// after being held for held: cause is Lease.Err's (ErrLeaseExpired,
	// ErrLeaseLost, or the error of a Release that failed).
	LeaseLost(name string, held time.Duration, cause error)
}

// RefreshObserver is an Observer that also hears of failed background
// refreshes (auto-refresh, the default for leases). admin.Counters
// implements it.
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
