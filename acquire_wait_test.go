package redsem

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// boundedPool is a pool of at most n connections that waits for a free one:
// with one connection per waiter, more than n waiters would starve it.
func boundedPool(t testing.TB, addr string, n int) *redis.Pool {
	p := &redis.Pool{
		MaxIdle: n, MaxActive: n, Wait: true,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr)
		},
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// Many goroutines wait on one Semaphore through a pool of two connections:
// they queue in the process behind one blocking call, and are served in
// the order they started waiting, each exactly once. With two pumps the
// same holds, and once the last waiter is served no pump stays blocked in
// Redis. (internal/faults reproduces the case that once left a pump
// waiting for nobody: the last waiter served while the other pump was
// queued in Redis behind another client.)
func TestSemaphore_Acquire_sharedWaitFIFOOnFewConnections(t *testing.T) {
	t.Parallel()
	for _, pumps := range []int{1, 2} {
		t.Run(fmt.Sprintf("pumps=%d", pumps), func(t *testing.T) { sharedWaitFIFO(t, pumps) })
	}
}

func sharedWaitFIFO(t *testing.T, pumps int) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const waiters = 100
		ctx := ctxT(t, 60*time.Second)
		holder := newSem(t, b, "shared", 1)
		held, err := holder.Acquire(ctx)
		require.NoError(t, err)

		s, err := NewSemaphore(boundedPool(t, b.addr, pumps+1), "shared", 1, WithWaitConnections(pumps))
		require.NoError(t, err)
		var mu sync.Mutex
		var served []int
		var wg sync.WaitGroup
		errs := make(chan error, waiters)
		for i := 0; i < waiters; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				l, err := s.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				served = append(served, i)
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					errs <- err
				}
			}(i)
			require.Eventually(t, func() bool { w, _ := s.waitingHere(); return w == i+1 }, 30*time.Second, time.Millisecond)
		}
		_, running := s.waitingHere()
		assert.Equal(t, pumps, running, "%d blocking calls serve all waiters", pumps)
		require.NoError(t, held.Release(ctx))
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		want := make([]int, waiters)
		for i := range want {
			want[i] = i
		}
		assert.Equal(t, want, served, "served in arrival order")
		assert.True(t, s.pumpsIdleWithin(10*time.Second), "the pumps stop when nobody waits")
		if b.srv != nil {
			list, err := redis.String(b.do(t, "CLIENT", "LIST"), nil)
			require.NoError(t, err)
			assert.NotContains(t, list, "cmd=blmove", "no pump left blocked in Redis")
		}
		// A pump that stopped with a grant nobody took gives it back in
		// the background (a settle), maybe just after it went idle.
		require.Eventually(t, func() bool {
			st, err := holder.Status(ctx)
			return err == nil && st.Available == 1
		}, 30*time.Second, 10*time.Millisecond, "the token comes back")
		requireInventory(t, holder, 1, 0)
	})
}

// A waiter whose context ends leaves the local queue without a round trip;
// the others keep their places.
func TestSemaphore_Acquire_sharedWaitCancelCostsNoRoundTrip(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	holder := newSem(t, b, "leave", 1)
	held, err := holder.Acquire(ctx)
	require.NoError(t, err)

	cp := &countPool{Pool: b.pool}
	s, err := NewSemaphore(cp, "leave", 1)
	require.NoError(t, err)
	type w struct {
		cancel context.CancelFunc
		got    <-chan *Lease
	}
	var ws []w
	for i := 0; i < 6; i++ {
		wctx, cancel := context.WithCancel(ctx)
		ws = append(ws, w{cancel, acquireAsync(wctx, s.Acquire)})
		require.Eventually(t, func() bool { n, _ := s.waitingHere(); return n == i+1 }, 5*time.Second, time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the pump is blocked in Redis
	before := cp.trips.Load()
	for _, i := range []int{1, 2, 4} {
		ws[i].cancel()
		_, ok := <-ws[i].got
		assert.False(t, ok, "waiter %d gave up", i)
	}
	assert.Equal(t, before, cp.trips.Load(), "leaving the queue cost no round trip")
	n, _ := s.waitingHere()
	assert.Equal(t, 3, n)

	require.NoError(t, held.Release(ctx))
	for _, i := range []int{0, 3, 5} {
		l, ok := <-ws[i].got
		require.True(t, ok, "waiter %d", i)
		require.NoError(t, l.Release(ctx))
	}
	for _, x := range ws {
		x.cancel()
	}
	assert.True(t, s.pumpsIdleWithin(2*time.Second))
	requireInventory(t, holder, 1, 0)
}

// A storm of local waiters with tiny deadlines on one Semaphore while
// holders come and go: a lease that reaches a waiter that has just left is
// handed on or given back, so exactly the tokens remain.
//
// Most waiters give up after 1-20ms, less than one round trip when the
// machine is loaded (miniredis runs each script in a fresh gopher-lua state,
// several milliseconds under -race): how many of those are granted depends
// on the machine, not on the library. Every tenth waiter is patient, and
// each of those must be granted: nobody who waits long enough is left
// waiting while tokens are free, however many leave around it.
func TestSemaphore_Acquire_sharedWaitCancellationStorm(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		const size, waiters = 2, 200
		ctx := ctxT(t, 60*time.Second)
		s := newSem(t, b, "shared-storm", size)
		// Load the scripts first: the storm is about the protocol, not
		// about the first EVAL's compile time.
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		// Every token is held for the first 100ms: the impatient waiters
		// that arrive in that time give up before one is free, however
		// fast the machine and the client are, so the storm does cancel.
		held := make([]*Lease, size)
		for i := range held {
			held[i], err = s.TryAcquire(ctx)
			require.NoError(t, err)
		}
		freed := make(chan struct{})
		time.AfterFunc(100*time.Millisecond, func() {
			defer close(freed)
			for _, h := range held {
				assert.NoError(t, h.Release(ctx))
			}
		})
		var grants, patientGrants, timeouts atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, waiters)
		for i := 0; i < waiters; i++ {
			wg.Add(1)
			go func(seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				time.Sleep(time.Duration(rng.Intn(300)) * time.Millisecond)
				patient := seed%10 == 0
				wait := time.Duration(1+rng.Intn(20)) * time.Millisecond
				if patient {
					wait = 20 * time.Second
				}
				wctx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				l, err := s.Acquire(wctx)
				switch {
				case err == nil:
					grants.Add(1)
					if patient {
						patientGrants.Add(1)
					}
					time.Sleep(time.Duration(rng.Intn(3)) * time.Millisecond)
					if err := l.Release(ctx); err != nil {
						errs <- err
					}
				case errors.Is(err, context.DeadlineExceeded) && !patient:
					timeouts.Add(1)
				default:
					errs <- fmt.Errorf("waiter %d (patient %v): %w", seed, patient, err)
				}
			}(int64(i))
		}
		wg.Wait()
		<-freed
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		t.Logf("%s: %d waiters, %d grants, %d timed out", b.name, waiters, grants.Load(), timeouts.Load())
		assert.EqualValues(t, waiters/10, patientGrants.Load(), "every patient waiter is granted")
		assert.Positive(t, timeouts.Load())
		assert.True(t, s.pumpsIdleWithin(5*time.Second), "pumps stop")
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			return err == nil && st.Available == size && len(st.Holders) == 0
		}, 5*time.Second, 10*time.Millisecond)
		requireInventory(t, s, size, 0)
	})
}

// An error that ends the pump's wait reaches every waiter: here the
// semaphore is deleted and recreated with another size under them.
func TestSemaphore_Acquire_sharedWaitErrorReachesWaiters(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	holder := newSem(t, b, "shifting", 1, WithFixedTTL()) // its lease is dropped
	_, err := holder.Acquire(ctx)
	require.NoError(t, err)
	s := newSem(t, b, "shifting", 1, WithGrace(100*time.Millisecond))
	var got []<-chan error
	for i := 0; i < 3; i++ {
		c := make(chan error, 1)
		go func() { _, err := s.Acquire(ctx); c <- err }()
		got = append(got, c)
	}
	require.Eventually(t, func() bool { n, _ := s.waitingHere(); return n == 3 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, holder.Delete(ctx))
	other := newSem(t, b, "shifting", 2)
	l, err := other.Acquire(ctx) // creates it with size 2; a token reaches the pump
	require.NoError(t, err)
	for _, c := range got {
		select {
		case err := <-c:
			assert.ErrorIs(t, err, ErrSizeMismatch)
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter never heard of the mismatch")
		}
	}
	require.NoError(t, l.Release(ctx))
	assert.True(t, s.pumpsIdleWithin(2*time.Second))
	// The token the BLMOVE moved into the pump's pending list went back when
	// the script refused it.
	require.Eventually(t, func() bool {
		_, _ = other.Reclaim(ctx)
		st, err := other.Status(ctx)
		return err == nil && st.Available == 2
	}, 10*time.Second, 50*time.Millisecond)
}

func TestSemaphore_WithWaitConnections_rejectsBadValues(t *testing.T) {
	t.Parallel()
	b := &backend{pool: &redis.Pool{}}
	for _, n := range []int{-1, 1025} {
		_, err := NewSemaphore(b.pool, "x", 1, WithWaitConnections(n))
		assert.ErrorIs(t, err, ErrInvalidOption, "%d", n)
	}
}

// A burst of goroutines reaching an empty queue at once: only the try that
// starts the pump stays registered in Redis for it to go on with; the
// others try plainly and queue, so none has to take a registration back
// (about one round trip each while they wait, not two).
func TestSemaphore_Acquire_sharedWaitBurstRegistersOnce(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	holder := newSem(t, b, "burst", 1)
	held, err := holder.Acquire(ctx)
	require.NoError(t, err)
	cp := &countPool{Pool: b.pool}
	s, err := NewSemaphore(cp, "burst", 1)
	require.NoError(t, err)
	const n = 40
	start := make(chan struct{})
	errs := make(chan error, n)
	var ready sync.WaitGroup
	for i := 0; i < n; i++ {
		ready.Add(1)
		go func() {
			ready.Done()
			<-start
			l, err := s.Acquire(ctx)
			if err == nil {
				err = l.Release(ctx)
			}
			errs <- err
		}()
	}
	ready.Wait()
	close(start)
	require.Eventually(t, func() bool { w, _ := s.waitingHere(); return w == n }, 5*time.Second, time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	// n tries and the pump's wait, plus a few when a plain try queued first
	// and started the pump itself (its fast path, and the settle of the
	// registration it did not need). Every waiter taking a registration
	// back would be 2n.
	assert.LessOrEqual(t, cp.trips.Load(), int64(n+5), "no registration taken back per waiter")
	require.NoError(t, held.Release(ctx))
	for i := 0; i < n; i++ {
		require.NoError(t, <-errs)
	}
	assert.True(t, s.pumpsIdleWithin(2*time.Second))
	requireInventory(t, holder, 1, 0)
}
