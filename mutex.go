package redsem

import "context"

// Mutex is a Semaphore of size 1: at most one holder at a time, across every
// process using the same name. A Mutex and a Semaphore of size 1 with the
// same name and prefix are the same lock; a Semaphore of another size with
// that name gets ErrSizeMismatch.
//
// Lock returns a *Lease; unlock it with Lease.Release:
//
//	lease, err := mu.Lock(ctx)
//	if err != nil { ... }
//	defer lease.Release(ctx)
type Mutex struct {
	sem *Semaphore
}

// NewMutex returns the mutex called name. Like NewSemaphore it only checks its
// arguments; the first Lock creates the mutex in Redis.
func NewMutex(pool Pool, name string, opts ...Option) (*Mutex, error) {
	s, err := NewSemaphore(pool, name, 1, opts...)
	if err != nil {
		return nil, err
	}
	s.observedAs = "mutex"
	return &Mutex{sem: s}, nil
}

// Lock blocks until the mutex is free or ctx ends; see Semaphore.Acquire.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) { return m.sem.Acquire(ctx) }

// TryLock returns a lease if the mutex is free now and ErrNoToken otherwise;
// see Semaphore.TryAcquire.
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) { return m.sem.TryAcquire(ctx) }
