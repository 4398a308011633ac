package redsem

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// The Gate keeps both limits: at most C in flight and at most n starts per
// interval; a cancelled Acquire holds nothing.
func TestGateInFlightAndRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const inflight, n = 2, 4
		per := 200 * time.Millisecond
		ctx := ctxT(t, 10*time.Second)
		sem := newSem(t, b, "api", inflight)
		rg := newRateGate(t, b, "api", n, per)
		gate, err := NewGate(sem, rg)
		require.NoError(t, err)
		_, err = NewGate(nil, rg)
		require.ErrorIs(t, err, ErrInvalidOption)

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
					l, err := gate.Acquire(ctx)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					running++
					most = max(most, running)
					starts = append(starts, l.Start.At)
					mu.Unlock()
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
		requireInventory(t, sem, inflight, 0)

		// The rate is spent: a cancelled Acquire gives its slot back, and
		// TryAcquire says when to retry. The spent gate's interval is an
		// hour, so no start comes back meanwhile, however slow the machine
		// (with per's 200ms one did, between the draining and the Acquire).
		spent := newRateGate(t, b, "api-spent", n, time.Hour)
		gate, err = NewGate(sem, spent)
		require.NoError(t, err)
		for i := 0; i < n; i++ {
			_, err := spent.Allow(ctx)
			require.NoError(t, err)
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		_, err = gate.Acquire(cctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		requireInventory(t, sem, inflight, 0)
		_, err = gate.TryAcquire(ctx)
		var rl *rate.LimitedError
		require.ErrorAs(t, err, &rl)
		assert.Greater(t, rl.RetryAfter, 59*time.Minute)
		requireInventory(t, sem, inflight, 0)
		var nilLease *GateLease
		assert.ErrorIs(t, nilLease.Release(ctx), ErrLeaseLost)
		assert.True(t, errors.Is(err, rate.ErrRateLimited))
	})
}

// A rate gate and a Semaphore of the same name are two things: they share
// the hash tag (one cluster slot) but no key.
func TestGateAndSemaphoreOfOneNameShareNoKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 5*time.Second)
		rg := newRateGate(t, b, "partner", 2, time.Minute)
		_, err := rg.Allow(ctx)
		require.NoError(t, err)
		gateKeys, err := redis.Strings(b.do(t, "KEYS", "*"), nil)
		require.NoError(t, err)
		require.NotEmpty(t, gateKeys)

		s := newSem(t, b, "partner", 1)
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		for _, k := range gateKeys {
			assert.Contains(t, k, "{partner}:rate:")
		}
		assert.Equal(t, 1, b.llen(t, s.k.tokens))
		st, err := rg.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Available, "the semaphore took nothing of the gate's")
	})
}

func newRateGate(t testing.TB, b *backend, name string, n int, per time.Duration, opts ...rate.Option) *rate.Gate {
	t.Helper()
	g, err := rate.New(b.pool, name, n, per, opts...)
	require.NoError(t, err)
	return g
}
