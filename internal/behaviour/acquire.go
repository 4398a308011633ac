package behaviour

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

func testAcquireRelease(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 2, redsem.WithLabel("bt-label"))
	l, err := s.Acquire(c)
	require.NoError(t, err)
	assert.True(t, l.Valid())
	st, err := e.adm().Status(c)
	require.NoError(t, err)
	assert.True(t, st.Exists)
	assert.Equal(t, 2, st.Size)
	assert.Equal(t, 1, st.Available)
	require.Len(t, st.Holders, 1)
	assert.Equal(t, l.Token(), st.Holders[0].Token)
	assert.Equal(t, l.Fence(), st.Holders[0].Fence)
	assert.Equal(t, "bt-label", st.Holders[0].Label)
	require.NoError(t, l.Release(c))
	assert.False(t, l.Valid())
	require.ErrorIs(t, l.Release(c), redsem.ErrReleased)
	require.ErrorIs(t, l.Refresh(c, time.Minute), redsem.ErrReleased)
	e.requireWhole(t, 2, 0)
}

func testTryAcquire(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 2)
	a, err := s.TryAcquire(c)
	require.NoError(t, err)
	b, err := s.TryAcquire(c)
	require.NoError(t, err)
	assert.NotEqual(t, a.Token(), b.Token())
	_, err = s.TryAcquire(c)
	require.ErrorIs(t, err, redsem.ErrNoToken)
	e.requireWhole(t, 0, 2)
	require.NoError(t, a.Release(c))
	a, err = s.TryAcquire(c)
	require.NoError(t, err)
	require.NoError(t, a.Release(c))
	require.NoError(t, b.Release(c))
	e.requireWhole(t, 2, 0)
}

// testFIFOHandoff: waiters of different clients (one Semaphore each, as
// separate processes would have) are served in the order they blocked in
// Redis, and each release wakes exactly the next one. It runs alone, so
// that every client blocked on the server is one of its waiters.
func testFIFOHandoff(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	s := e.sem(t, 1)
	held, err := s.Acquire(c)
	require.NoError(t, err)
	const n = 3
	type grant struct {
		i   int
		l   *redsem.Lease
		err error
	}
	granted := make(chan grant, n)
	for i := 0; i < n; i++ {
		w := e.sem(t, 1, redsem.WithWaitConnections(0))
		go func() {
			l, err := w.Acquire(c)
			granted <- grant{i, l, err}
		}()
		WaitFor(t, 10*time.Second, "waiter blocked", func() bool { return e.blocked(t) >= i+1 })
	}
	cur := held
	for want := 0; want < n; want++ {
		select {
		case g := <-granted:
			t.Fatalf("waiter %d served while the token was held (err %v)", g.i, g.err)
		case <-time.After(50 * time.Millisecond):
		}
		require.NoError(t, cur.Release(c))
		select {
		case g := <-granted:
			require.NoError(t, g.err)
			require.Equal(t, want, g.i, "served out of order")
			cur = g.l
		case <-c.Done():
			t.Fatalf("waiter %d not served", want)
		}
	}
	require.NoError(t, cur.Release(c))
	e.requireWhole(t, 1, 0)
}

// testSharedWaiters: many goroutines waiting on one Semaphore (sharing its
// wait connection) are all served.
func testSharedWaiters(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	s := e.sem(t, 2)
	const n = 10
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			l, err := s.Acquire(c)
			if err == nil {
				time.Sleep(5 * time.Millisecond)
				err = l.Release(c)
			}
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		require.NoError(t, <-errs)
	}
	e.requireWhole(t, 2, 0)
}

// testHammer: goroutines of three clients acquire and release at random; at
// no moment do more than size hold, every fence is unique, and the
// inventory is whole at the end.
func testHammer(t *testing.T, e *env) {
	c := ctx(t, 60*time.Second)
	const size, workers, rounds = 3, 12, 8
	sems := []*redsem.Semaphore{
		e.sem(t, size), e.sem(t, size), e.sem(t, size, redsem.WithWaitConnections(0)),
	}
	var (
		in, maxIn atomic.Int64
		mu        sync.Mutex
		fences    = map[int64]bool{}
		dup       []int64
	)
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		s := sems[w%len(sems)]
		go func() {
			var ferr error
			for r := 0; r < rounds && ferr == nil; r++ {
				var l *redsem.Lease
				var err error
				if (w+r)%4 == 0 {
					l, err = s.TryAcquire(c)
					if errors.Is(err, redsem.ErrNoToken) {
						continue
					}
				} else {
					l, err = s.Acquire(c)
				}
				if err != nil {
					ferr = err
					break
				}
				now := in.Add(1)
				for m := maxIn.Load(); now > m && !maxIn.CompareAndSwap(m, now); m = maxIn.Load() {
				}
				mu.Lock()
				if fences[l.Fence()] {
					dup = append(dup, l.Fence())
				}
				fences[l.Fence()] = true
				mu.Unlock()
				time.Sleep(time.Millisecond)
				in.Add(-1)
				ferr = l.Release(c)
			}
			errs <- ferr
		}()
	}
	for w := 0; w < workers; w++ {
		require.NoError(t, <-errs)
	}
	assert.LessOrEqual(t, maxIn.Load(), int64(size), "holders at once")
	assert.Empty(t, dup, "fences granted twice")
	assert.Greater(t, len(fences), workers, "grants")
	e.requireWhole(t, size, 0)
}

func testFencesIncrease(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 2)
	other := e.sem(t, 2)
	var last int64
	for i := 0; i < 6; i++ {
		from := s
		if i%2 == 1 {
			from = other
		}
		l, err := from.Acquire(c)
		require.NoError(t, err)
		assert.Greater(t, l.Fence(), last, "fence of grant %d", i)
		last = l.Fence()
		require.NoError(t, l.Release(c))
	}
}

// testRefreshAndExpiry: Refresh extends a lease; an unrefreshed lease
// expires, its token is reclaimed by the next acquirer, and the old holder
// learns it lost the lease.
func testRefreshAndExpiry(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 1, redsem.WithTTL(400*time.Millisecond), redsem.WithFixedTTL())
	l, err := s.Acquire(c)
	require.NoError(t, err)
	before := l.Deadline()
	require.NoError(t, l.Refresh(c, 2*time.Second))
	assert.True(t, l.Deadline().After(before.Add(time.Second)), "deadline moved: %v -> %v", before, l.Deadline())
	require.NoError(t, l.Refresh(c, 300*time.Millisecond))
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease did not expire locally")
	}
	assert.False(t, l.Valid())
	require.ErrorIs(t, l.Refresh(c, time.Second), redsem.ErrLeaseExpired)
	// The server's deadline passes too; the next Acquire reclaims the token.
	next, err := e.sem(t, 1, redsem.WithFixedTTL()).Acquire(c)
	require.NoError(t, err)
	require.ErrorIs(t, l.Release(c), redsem.ErrLeaseLost)
	require.NoError(t, next.Release(c))
	e.requireWhole(t, 1, 0)
}

// testCancelledAcquire: an Acquire blocked in Redis returns when its
// context is cancelled, not when its block ends (the holder's deadline,
// DefaultTTL away), on its own connection and on a shared one (20 cancels
// in all), and no token is lost. How soon (CancelBound on a machine with
// time to spare) is logged, not judged: a loaded machine stretches it.
func testCancelledAcquire(t *testing.T, e *env) {
	own := e.sem(t, 1, redsem.WithWaitConnections(0))
	shared := e.sem(t, 1)
	lat := cancelLatencies(t, e, []*redsem.Semaphore{own, shared}, 10)
	require.Len(t, lat, 20)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("cancel to return: p50 %v, max %v over %d (CancelBound %v)", lat[len(lat)/2], lat[len(lat)-1], len(lat), CancelBound)
}

// cancelLatencies holds the single token of the semaphores (one name) and
// cancels rounds blocked Acquires on each, returning how long each took to
// return after its cancel. It checks that each failed with
// context.Canceled and that the token is free again afterwards.
func cancelLatencies(t *testing.T, e *env, sems []*redsem.Semaphore, rounds int) []time.Duration {
	c := ctx(t, 60*time.Second)
	held, err := sems[0].Acquire(c)
	require.NoError(t, err)
	var lat []time.Duration
	for r := 0; r < rounds; r++ {
		for _, s := range sems {
			wctx, cancel := context.WithCancel(c)
			done := make(chan error, 1)
			go func() {
				_, err := s.Acquire(wctx)
				done <- err
			}()
			// Let it get blocked in Redis (a waiter registers within a
			// round trip or two).
			time.Sleep(time.Duration(20+r%5*10) * time.Millisecond)
			cancel()
			at := time.Now()
			select {
			case err := <-done:
				lat = append(lat, time.Since(at))
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(10 * time.Second):
				t.Fatal("cancelled Acquire did not return")
			}
		}
	}
	require.NoError(t, held.Release(c))
	// Nothing lost: the token comes back free (settling may finish just
	// after the cancelled Acquire returned).
	WaitFor(t, 10*time.Second, "token free again", func() bool {
		inv, err := e.adm().Check(c)
		return err == nil && inv.Healthy() && len(inv.Free) == 1
	})
	l, err := sems[0].TryAcquire(c)
	require.NoError(t, err)
	require.NoError(t, l.Release(c))
	return lat
}

// testDeadlineAcquire: an Acquire whose context has a deadline returns at
// it, neither before nor only when the test's own context ends.
func testDeadlineAcquire(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 1, redsem.WithWaitConnections(0))
	held, err := s.Acquire(c)
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		const d = 300 * time.Millisecond
		dctx, cancel := context.WithTimeout(c, d)
		deadline, _ := dctx.Deadline()
		_, err := s.Acquire(dctx)
		late := time.Since(deadline)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.GreaterOrEqual(t, late, -10*time.Millisecond, "returned before its deadline")
		require.NoError(t, c.Err(), "returned %v after its deadline, with the test's context", late)
		t.Logf("returned %v after its deadline (CancelBound %v)", late, CancelBound)
	}
	require.NoError(t, held.Release(c))
	WaitFor(t, 10*time.Second, "token free again", func() bool {
		inv, err := e.adm().Check(c)
		return err == nil && inv.Healthy() && len(inv.Free) == 1
	})
}
