package admin

import (
	"context"
	"encoding/json"
	"expvar"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/rate"
)

// Counters sees every kind of event: grants with their waits, busy
// TryAcquires, timeouts, cancellations, releases with hold times, lost
// leases, and reclaimed tokens; and it publishes as an expvar.
func TestCountersObserveEveryEvent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		var c Counters
		// The first lease has a long TTL (auto-refresh of a 200ms TTL lost
		// it on a loaded machine); the second is fixed, and expires
		// unreleased.
		s := newSem(t, b, "observed", 1, redsem.WithObserver(&c), redsem.WithTTL(10*time.Second), redsem.WithAutoRefresh())
		fixed := newSem(t, b, "observed", 1, redsem.WithObserver(&c), redsem.WithTTL(200*time.Millisecond), redsem.WithFixedTTL())

		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, redsem.ErrNoToken)
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

		lost, err := fixed.Acquire(ctx) // expires unreleased
		require.NoError(t, err)
		<-lost.Done()
		require.Eventually(t, func() bool { return c.Snapshot().Lost == 1 }, 5*time.Second, time.Millisecond, "%+v", c.Snapshot())
		snap := c.Snapshot()
		assert.Equal(t, int64(2), snap.Acquired)
		assert.Equal(t, int64(1), snap.Busy)
		assert.Equal(t, int64(1), snap.Timeouts)
		assert.Equal(t, int64(1), snap.Cancellations)
		assert.Equal(t, int64(0), snap.Failures)
		assert.Equal(t, int64(1), snap.Released)
		assert.Equal(t, int64(1), snap.Lost)
		assert.Equal(t, int64(0), snap.Holding)
		assert.GreaterOrEqual(t, snap.HoldTotal, 20*time.Millisecond)

		var parsed map[string]float64
		require.NoError(t, json.Unmarshal([]byte(c.String()), &parsed))
		assert.Equal(t, float64(2), parsed["acquired"])
		var _ expvar.Var = &c
		var _ redsem.RefreshObserver = &c
		var _ rate.Observer = &c
	})
}

// A rate gate reports each start it grants and each refusal or timeout to
// the observer given with WithObserver.
func TestObserverSeesRateGate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		var c Counters
		g := newRateGate(t, b, "observed-rate", 2, time.Minute, rate.WithObserver(&c))
		for i := 0; i < 2; i++ {
			_, err := g.Allow(ctx)
			require.NoError(t, err)
		}
		_, err := g.Allow(ctx)
		require.ErrorIs(t, err, rate.ErrRateLimited)
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = g.Wait(wctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		snap := c.Snapshot()
		assert.Equal(t, int64(2), snap.Acquired)
		assert.Equal(t, int64(1), snap.Busy)
		assert.Equal(t, int64(1), snap.Timeouts)
		assert.Equal(t, int64(0), snap.Failures)
	})
}
