package redsem

import (
	"context"
	"errors"
	"time"
)

// Observer receives a Semaphore's events, for metrics. Its methods must be
// fast and safe for concurrent use: Acquired and AcquireFailed run on the
// acquiring goroutine, Released and LeaseLost on a goroutine of their own
// once the lease has ended, maybe after Release returned. admin.Counters is a ready-made Observer; an adapter to
// Prometheus or OpenTelemetry is a few lines (see docs/metrics.md). An Observer
// that also implements RefreshObserver hears of failed background
// refreshes, and one that implements ContextObserver hears each
// acquisition with its caller's context, for tracing.
//
// Every acquisition of a Semaphore (Acquire, TryAcquire, AcquireN,
// TryAcquireN, a Mutex's Lock and TryLock, and an Election's Campaign)
// reports Acquired or
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

// ContextObserver is an Observer that also hears each acquisition with its
// caller's context, so that it can trace the wait and the hold under the
// caller's trace (the otel module's observer does). Every kind reports to
// it: "semaphore" and "mutex" (a Mutex's Lock and TryLock), "rwmutex.read"
// and "rwmutex.write", "election" (an Election's Campaign), and a rate
// gate's or quota's starts, "rate" (package
// rate's WithObserver takes the same methods, HoldEnded aside). The three
// methods of one acquisition are called in order, each given what the one
// before returned, and must be fast and safe for concurrent use.
type ContextObserver interface {
	Observer
	// WaitStarted reports that an acquisition of kind on name begins, on
	// the acquiring goroutine, with the caller's ctx. What it returns (ctx,
	// or a context derived from it, carrying a span) goes to WaitEnded;
	// the acquisition itself runs under ctx.
	WaitStarted(ctx context.Context, kind, name string) context.Context
	// WaitEnded reports the acquisition's outcome, right after Acquired or
	// AcquireFailed: err nil and the grant's fence (0 for a rate start,
	// which has none), or the error the caller gets. For a lease granted,
	// what it returns goes to HoldEnded.
	WaitEnded(ctx context.Context, fence int64, err error) context.Context
	// HoldEnded reports that the lease granted has ended, right after
	// Released or LeaseLost, on their goroutine: cause is ErrReleased,
	// ErrLeaseExpired, ErrLeaseLost, or the error of a Release that failed
	// (the tokens may have gone back).
	HoldEnded(ctx context.Context, cause error)
}

// observeRefreshFailed reports a failed background refresh of l.
func (l *Lease) observeRefreshFailed(err error) {
	if ro, ok := l.sem.cfg.observer.(RefreshObserver); ok {
		ro.RefreshFailed(l.sem.name, err)
	}
}

// watch is an acquisition being observed: when it began and, for a
// ContextObserver, what its WaitStarted returned.
type watch struct {
	start time.Time
	ctx   context.Context
}

// watch begins observing an acquisition of kind under ctx.
func (s *Semaphore) watch(ctx context.Context, kind string) watch {
	w := watch{start: time.Now()}
	if co, ok := s.cfg.observer.(ContextObserver); ok {
		w.ctx = co.WaitStarted(ctx, kind, s.name)
	}
	return w
}

// role is the kind of s's own acquisitions, for a ContextObserver.
func (s *Semaphore) role() string {
	if s.observedAs != "" {
		return s.observedAs
	}
	return "semaphore"
}

// observeAcquire reports the outcome of acquisition w, and arranges for the
// lease's end to be reported.
func (s *Semaphore) observeAcquire(w watch, l *Lease, err error) (*Lease, error) {
	o := s.cfg.observer
	if o == nil {
		return l, err
	}
	co, _ := o.(ContextObserver)
	wait := time.Since(w.start)
	if err != nil {
		o.AcquireFailed(s.name, wait, err)
		if co != nil {
			co.WaitEnded(w.ctx, 0, err)
		}
		return l, err
	}
	o.Acquired(s.name, wait)
	var hold context.Context
	if co != nil {
		hold = co.WaitEnded(w.ctx, l.Fence(), nil)
	}
	granted := time.Now()
	context.AfterFunc(l.Context(), func() {
		held := time.Since(granted)
		cause := context.Cause(l.Context())
		if errors.Is(cause, ErrReleased) {
			o.Released(s.name, held)
		} else {
			o.LeaseLost(s.name, held, cause)
		}
		if co != nil {
			co.HoldEnded(hold, cause)
		}
	})
	return l, nil
}
