package rate

import (
	"context"
	"time"
)

// Observer receives a Gate's or Quota's events, for metrics: one call for
// each Wait, WaitN, Allow or AllowN. Its methods run on the goroutine that caused the event and must be
// fast and safe for concurrent use. It is the start-side half of
// redsem.Observer, so a redsem.Observer (an *admin.Counters included) serves
// here too; a gate's starts are not held, so nothing follows a grant.
//
// An Observer that also has redsem.ContextObserver's WaitStarted and
// WaitEnded methods (any redsem.ContextObserver has) hears each start with
// its caller's context, for tracing: WaitStarted(ctx, "rate", name) as it
// begins, then WaitEnded with a fence of 0 and the error, right after
// Acquired or AcquireFailed.
type Observer interface {
	// Acquired reports a start granted after wait.
	Acquired(name string, wait time.Duration)
	// AcquireFailed reports a start that failed with err after wait:
	// ErrRateLimited (Allow), the context's error, or another failure.
	AcquireFailed(name string, wait time.Duration, err error)
}

// contextObserver is an Observer with redsem.ContextObserver's wait half.
type contextObserver interface {
	Observer
	WaitStarted(ctx context.Context, kind, name string) context.Context
	WaitEnded(ctx context.Context, fence int64, err error) context.Context
}

// watch is a start being observed: when it began and, for a
// contextObserver, what its WaitStarted returned.
type watch struct {
	start time.Time
	ctx   context.Context
}

// watch begins observing a start under ctx.
func (q *Quota) watch(ctx context.Context) watch {
	w := watch{start: time.Now()}
	if co, ok := q.cfg.observer.(contextObserver); ok {
		w.ctx = co.WaitStarted(ctx, "rate", q.name)
	}
	return w
}

// observeTake reports the outcome of start w.
func (q *Quota) observeTake(w watch, st Start, err error) (Start, error) {
	o := q.cfg.observer
	if o == nil {
		return st, err
	}
	if err != nil {
		o.AcquireFailed(q.name, time.Since(w.start), err)
	} else {
		o.Acquired(q.name, time.Since(w.start))
	}
	if co, ok := o.(contextObserver); ok {
		co.WaitEnded(w.ctx, 0, err)
	}
	return st, err
}
