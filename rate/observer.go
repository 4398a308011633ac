package rate

import "time"

// Observer receives a Gate's or Quota's events, for metrics: one call for
// each Wait, WaitN, Allow or AllowN. Its methods run on the goroutine that caused the event and must be
// fast and safe for concurrent use. It is the start-side half of
// redsem.Observer, so a redsem.Observer (an *admin.Counters included) serves
// here too; a gate's starts are not held, so nothing follows a grant.
type Observer interface {
	// Acquired reports a start granted after wait.
	Acquired(name string, wait time.Duration)
	// AcquireFailed reports a start that failed with err after wait:
	// ErrRateLimited (Allow), the context's error, or another failure.
	AcquireFailed(name string, wait time.Duration, err error)
}

// observeTake reports the outcome of a start that began at start.
func (q *Quota) observeTake(start time.Time, st Start, err error) (Start, error) {
	o := q.cfg.observer
	if o == nil {
		return st, err
	}
	if err != nil {
		o.AcquireFailed(q.name, time.Since(start), err)
	} else {
		o.Acquired(q.name, time.Since(start))
	}
	return st, err
}
