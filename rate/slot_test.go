package rate

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/redistest"
)

// requireAllFree fails unless every one of sem's size slots is free: a
// TryAcquireN of all of them succeeds (and is given back).
func requireAllFree(t *testing.T, ctx context.Context, sem *redsem.Semaphore) {
	t.Helper()
	l, err := sem.TryAcquireN(ctx, sem.Size())
	require.NoError(t, err, "a slot is still held")
	require.NoError(t, l.Release(ctx))
}

// A semaphore's slot plus WaitHolding keeps both limits: at most C in
// flight and at most n starts per interval; a cancelled wait or a refused
// AllowHolding holds nothing.
func TestHoldingKeepsInFlightAndRate(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		const inflight, n = 2, 4
		per := 200 * time.Millisecond
		ctx := ctxT(t, 10*time.Second)
		sem, err := redsem.NewSemaphore(b.pool, "api", inflight)
		require.NoError(t, err)
		gate := newGate(t, b, "api", n, per)

		var mu sync.Mutex
		var running, most int
		var starts []time.Time
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 2 {
					l, err := sem.Acquire(ctx)
					if err != nil {
						errs <- err
						return
					}
					st, err := gate.WaitHolding(ctx, l)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					running++
					most = max(most, running)
					starts = append(starts, st.At)
					mu.Unlock()
					// Hold until another holder runs too (or every start
					// is made, or 2s pass): the test must see the slots
					// full, whatever the machine's speed.
					for held := time.Now(); time.Since(held) < 2*time.Second; time.Sleep(time.Millisecond) {
						mu.Lock()
						full := running >= inflight || len(starts) == 16
						mu.Unlock()
						if full {
							break
						}
					}
					time.Sleep(15 * time.Millisecond)
					mu.Lock()
					running--
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			assert.NoError(t, err)
		}
		assert.Equal(t, inflight, most)
		assert.Len(t, starts, 16)
		assert.LessOrEqual(t, redistest.MaxInWindow(starts, per), n)
		requireAllFree(t, ctx, sem)

		// The rate is spent: a cancelled WaitHolding gives its slot back, and
		// AllowHolding says when to retry. The spent gate's interval is an
		// hour, so no start comes back meanwhile, however slow the machine.
		spent := newGate(t, b, "api-spent", n, time.Hour)
		for i := 0; i < n; i++ {
			_, err := spent.Allow(ctx)
			require.NoError(t, err)
		}
		l, err := sem.Acquire(ctx)
		require.NoError(t, err)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		_, err = spent.WaitHolding(cctx, l)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorIs(t, l.Err(), redsem.ErrReleased, "the slot was given back")
		requireAllFree(t, ctx, sem)

		l, err = sem.TryAcquire(ctx)
		require.NoError(t, err)
		_, err = spent.AllowHolding(ctx, l)
		var rl *LimitedError
		require.ErrorAs(t, err, &rl)
		assert.Greater(t, rl.RetryAfter, 59*time.Minute)
		assert.True(t, errors.Is(err, ErrRateLimited))
		assert.ErrorIs(t, l.Err(), redsem.ErrReleased, "the slot was given back")
		requireAllFree(t, ctx, sem)
	})
}

// A rate gate and a Semaphore of the same name are two things: they share
// the hash tag (one cluster slot) but no key.
func TestGateAndSemaphoreOfOneNameShareNoKey(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 5*time.Second)
		rg := newGate(t, b, "partner", 2, time.Minute)
		_, err := rg.Allow(ctx)
		require.NoError(t, err)
		gateKeys, err := redis.Strings(b.do(t, "KEYS", "*"), nil)
		require.NoError(t, err)
		require.NotEmpty(t, gateKeys)

		s, err := redsem.NewSemaphore(b.pool, "partner", 1)
		require.NoError(t, err)
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		for _, k := range gateKeys {
			assert.Contains(t, k, "{partner}:rate:")
		}
		assert.Equal(t, 1, b.num(t, "LLEN", redsem.DefaultPrefix+"{partner}:tokens"))
		st, err := rg.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Available, "the semaphore took nothing of the gate's")
	})
}
