// Package gocronlock is a gocron v2 Locker on redsem mutexes, so that a
// job scheduled on every replica runs on one at a time, across the fleet,
// and keeps its lock for as long as it runs: the lock refreshes itself
// (redsem's auto-refresh) instead of expiring mid-job (gocron issue #799);
// and a gocron v2 Elector on a redsem election (NewElector), so that only
// the replica that leads runs a scheduler's jobs. It is a module of its
// own, so the root module never depends on gocron.
package gocronlock

import (
	"context"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/redsem/redsem"
)

// Locker is a gocron.Locker: pass it to gocron.WithDistributedLocker. The
// lock of job key is the redsem mutex "gocron:<key>". It is safe for
// concurrent use.
type Locker struct {
	pool    redsem.Pool
	minHold time.Duration
	opts    []redsem.Option

	mu      sync.Mutex
	mutexes map[string]*redsem.Mutex
}

var _ gocron.Locker = (*Locker)(nil)

// New returns a Locker on pool whose locks are held for at least minHold
// after they are taken, however short the job: replicas whose schedules
// fire a little apart (clock skew, start-up) then skip the run instead of
// repeating it. Set minHold below the job's interval and above the skew,
// e.g. a second for a job every minute; 0 releases when the job ends. opts
// are given to every job's mutex (redsem.WithTTL, WithPrefix...).
func New(pool redsem.Pool, minHold time.Duration, opts ...redsem.Option) (*Locker, error) {
	if _, err := redsem.NewMutex(pool, "gocron:", opts...); err != nil { // checks pool and opts
		return nil, err
	}
	return &Locker{pool: pool, minHold: minHold, opts: opts, mutexes: map[string]*redsem.Mutex{}}, nil
}

// Lock takes job key's lock if no replica holds it, and fails otherwise
// (redsem.ErrNoToken) or while Redis fails: gocron then skips the run here.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	m, err := l.mutex(key)
	if err != nil {
		return nil, err
	}
	lease, err := m.TryLock(ctx)
	if err != nil {
		return nil, err
	}
	return &lock{lease: lease, until: time.Now().Add(l.minHold)}, nil
}

// mutex is job key's mutex, made on first use (jobs are few: one each).
func (l *Locker) mutex(key string) (*redsem.Mutex, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m, ok := l.mutexes[key]; ok {
		return m, nil
	}
	m, err := redsem.NewMutex(l.pool, "gocron:"+key, l.opts...)
	if err != nil {
		return nil, err
	}
	l.mutexes[key] = m
	return m, nil
}

// lock is a held job lock.
type lock struct {
	lease *redsem.Lease
	until time.Time // not released before then (minHold)
}

// Unlock releases the lock, or, before its minimum hold has passed,
// arranges for it to be released then (the lease refreshing itself until
// that time) and returns nil.
func (k *lock) Unlock(ctx context.Context) error {
	if wait := time.Until(k.until); wait > 0 {
		time.AfterFunc(wait, func() { _ = k.lease.Release(context.Background()) })
		return nil
	}
	return k.lease.Release(context.WithoutCancel(ctx))
}
