package rate

import "time"

// Observer receives a Gate's events, for metrics: one call for each Wait or
// Allow. Its methods run on the goroutine that caused the event and must be
// fast and safe for concurrent use. It is the start-side half of
// redsem.Observer, so a redsem.Observer (a *redsem.Counters included) serves
// here too; a gate's starts are not held, so nothing follows a grant.
type Observer interface {
	// Acquired reports a start granted after wait.
	Acquired(name string, wait time.Duration)
	// AcquireFailed reports a Wait or Allow that returned err after wait:
	// ErrRateLimited (Allow), the context's error, or another failure.
	AcquireFailed(name string, wait time.Duration, err error)
}

// observeTake reports the outcome of a Wait or Allow that started at start.
func (g *Gate) observeTake(start time.Time, st Start, err error) (Start, error) {
	o := g.cfg.observer
	if o == nil {
		return st, err
	}
	if err != nil {
		o.AcquireFailed(g.name, time.Since(start), err)
	} else {
		o.Acquired(g.name, time.Since(start))
	}
	return st, err
}
