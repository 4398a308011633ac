package redsem

import (
	"context"
	"encoding/json"
	"expvar"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Counters sees every kind of event: grants with their waits, busy
// TryAcquires, timeouts, cancellations, releases with hold times, lost
// leases, and reclaimed tokens; and it publishes as an expvar.
func TestCountersObserveEveryEvent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		var c Counters
		s := newSem(t, b, "observed", 1, WithObserver(&c), WithTTL(200*time.Millisecond))

		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = s.Acquire(tctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(30*time.Millisecond, cancel)
		_, err = s.Acquire(cctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, int64(1), c.Snapshot().Holding)
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, l.Release(ctx))

		lost, err := s.Acquire(ctx) // expires unreleased
		require.NoError(t, err)
		<-lost.Done()
		time.Sleep(50 * time.Millisecond)
		n, err := s.Reclaim(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)

		require.Eventually(t, func() bool { return c.Snapshot().Lost == 1 }, time.Second, time.Millisecond)
		snap := c.Snapshot()
		assert.Equal(t, int64(2), snap.Acquired)
		assert.Equal(t, int64(1), snap.Busy)
		assert.Equal(t, int64(1), snap.Timeouts)
		assert.Equal(t, int64(1), snap.Cancellations)
		assert.Equal(t, int64(0), snap.Failures)
		assert.Equal(t, int64(1), snap.Released)
		assert.Equal(t, int64(1), snap.Lost)
		assert.Equal(t, int64(1), snap.Reclaimed)
		assert.Equal(t, int64(0), snap.Holding)
		assert.GreaterOrEqual(t, snap.HoldTotal, 20*time.Millisecond)

		var parsed map[string]float64
		require.NoError(t, json.Unmarshal([]byte(c.String()), &parsed))
		assert.Equal(t, float64(2), parsed["acquired"])
		var _ expvar.Var = &c
	})
}

func TestWithObserverRejectsNil(t *testing.T) {
	_, err := NewSemaphore(&hookPool{}, "x", 1, WithObserver(nil))
	assert.ErrorIs(t, err, ErrInvalidOption)
}
