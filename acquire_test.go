package redsem

import (
	"errors"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSemaphore_Acquire_basics(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "basics", 3, WithLabel("test-holder"))
		var leases []*Lease
		var last int64
		for i := 0; i < 3; i++ {
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			assert.Greater(t, l.Fence(), last, "fences strictly increase")
			last = l.Fence()
			assert.True(t, l.Valid())
			assert.NoError(t, l.Err())
			assert.WithinDuration(t, time.Now().Add(DefaultTTL), l.Deadline(), 2*time.Second)
			leases = append(leases, l)
		}
		_, err := s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)

		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.True(t, st.Exists)
		assert.Equal(t, 3, st.Size)
		assert.Equal(t, 0, st.Available)
		require.Len(t, st.Holders, 3)
		slots := map[string]bool{}
		for i, h := range st.Holders {
			assert.Equal(t, leases[i].Token(), h.Token)
			assert.Equal(t, leases[i].Fence(), h.Fence)
			assert.Equal(t, "test-holder", h.Label)
			assert.False(t, h.Expired)
			slots[h.Token] = true
		}
		assert.Len(t, slots, 3, "three distinct tokens")

		require.NoError(t, leases[1].Release(ctx))
		assert.ErrorIs(t, leases[1].Err(), ErrReleased)
		assert.False(t, leases[1].Valid())
		select {
		case <-leases[1].Done():
		default:
			t.Fatal("Done not closed after Release")
		}
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		assert.Equal(t, leases[1].Token(), l.Token(), "the freed token is handed out again")
		assert.Greater(t, l.Fence(), last)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, leases[0].Release(ctx))
		require.NoError(t, leases[2].Release(ctx))
		requireInventory(t, s, 3, 0)
	})
}

// FM-10: the first client creates the semaphore; a client with another size
// gets a clear error and changes nothing.
func TestSemaphore_Acquire_sizeMismatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s5 := newSem(t, b, "sized", 5)
		l, err := s5.Acquire(ctx)
		require.NoError(t, err)
		s3 := newSem(t, b, "sized", 3)
		_, err = s3.Acquire(ctx)
		require.ErrorIs(t, err, ErrSizeMismatch)
		var sm *SizeMismatchError
		require.True(t, errors.As(err, &sm))
		assert.Equal(t, 5, sm.Stored)
		assert.Equal(t, 3, sm.Want)
		_, err = s3.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrSizeMismatch)
		mu, err := NewMutex(b.pool, "sized")
		require.NoError(t, err)
		_, err = mu.TryLock(ctx)
		require.ErrorIs(t, err, ErrSizeMismatch)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s5, 5, 0)
	})
}

// FM-10: many clients racing to create the semaphore make exactly one.
func TestSemaphore_Acquire_creationRace(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const racers, size = 40, 7
		type res struct {
			l   *Lease
			err error
		}
		out := make(chan res, racers)
		for i := 0; i < racers; i++ {
			go func() {
				s, err := NewSemaphore(b.pool, "race", size)
				if err != nil {
					out <- res{nil, err}
					return
				}
				l, err := s.TryAcquire(ctx)
				out <- res{l, err}
			}()
		}
		var got []*Lease
		for i := 0; i < racers; i++ {
			r := <-out
			if r.err != nil {
				require.ErrorIs(t, r.err, ErrNoToken)
				continue
			}
			got = append(got, r.l)
		}
		require.Len(t, got, size, "exactly size grants among the racers")
		epoch := strings.Split(got[0].Token(), ":")[0]
		for _, l := range got {
			assert.Equal(t, epoch, strings.Split(l.Token(), ":")[0], "one epoch")
			require.NoError(t, l.Release(ctx))
		}
		s := newSem(t, b, "race", size)
		requireInventory(t, s, size, 0)
	})
}

func TestMutex_Lock_basics(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		mu, err := NewMutex(b.pool, "mutex")
		require.NoError(t, err)
		l, err := mu.Lock(ctx)
		require.NoError(t, err)
		_, err = mu.TryLock(ctx)
		require.ErrorIs(t, err, ErrNoToken)

		got := acquireAsync(ctx, mu.Lock)
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, l.Release(ctx))
		l2, ok := <-got
		require.True(t, ok, "the blocked Lock acquires after Release")
		assert.Greater(t, l2.Fence(), l.Fence())
		require.NoError(t, l2.Release(ctx))
	})
}

// Concurrency invariant (the hammer): goroutines, each on its own
// connection, hammer a size-K semaphore. At every instant at most K hold,
// the limit is reached, no token is held twice, each token's fences
// increase, and afterwards exactly K tokens are free. It runs for dur, then
// on until the limit was reached (two minutes at most), so that a slow
// machine does not fail the guard that shows the check could fail.
func TestSemaphore_Acquire_hammerInvariants(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		const size, workers = 3, 12
		dur := 1500 * time.Millisecond
		ctx := ctxT(t, 3*time.Minute)
		var (
			mu        sync.Mutex
			holding   = map[string]bool{}
			lastFence = map[string]int64{}
			fences    = map[int64]bool{}
			cur, max  int
			holds     int
			problems  []string
		)
		deadline, hardStop := time.Now().Add(dur), time.Now().Add(2*time.Minute)
		going := func() bool {
			if time.Now().Before(deadline) {
				return true
			}
			mu.Lock()
			defer mu.Unlock()
			return max < size && time.Now().Before(hardStop)
		}
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				s, err := NewSemaphore(newPool(t, b.addr), "hammer", size)
				if err != nil {
					errs <- err
					return
				}
				for going() {
					l, err := s.Acquire(ctx)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					cur++
					holds++
					if cur > max {
						max = cur
					}
					if holding[l.Token()] {
						problems = append(problems, "token held twice: "+l.Token())
					}
					if l.Fence() <= lastFence[l.Token()] || fences[l.Fence()] {
						problems = append(problems, "fence did not increase for "+l.Token())
					}
					holding[l.Token()], lastFence[l.Token()], fences[l.Fence()] = true, l.Fence(), true
					mu.Unlock()
					time.Sleep(time.Duration(rng.Intn(2000)) * time.Microsecond)
					mu.Lock()
					cur--
					holding[l.Token()] = false
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			}(int64(w))
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		t.Logf("%s: %d holds by %d workers, max concurrent %d of %d", b.name, holds, workers, max, size)
		assert.Empty(t, problems)
		assert.Equal(t, size, max, "the limit was reached, so the check could fail")
		assert.Greater(t, holds, workers)
		s := newSem(t, b, "hammer", size)
		requireInventory(t, s, size, 0)
	})
}
