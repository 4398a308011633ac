package rate

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A blocked Wait counts as waiting in the gate's status until it leaves.
func TestStatusCountsWaiters(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		gate := newGate(t, b, "slow", 1, time.Hour)
		_, err := gate.Allow(ctx)
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := gate.Wait(wctx)
			done <- err
		}()
		require.Eventually(t, func() bool {
			st, err := gate.Status(ctx)
			return err == nil && st.Waiting == 1
		}, 10*time.Second, 10*time.Millisecond)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		// The cancelled Wait leaves the queue in the background (it returns
		// within the settle bound, maybe before its abort ran).
		var st Status
		require.Eventually(t, func() bool {
			var err error
			st, err = gate.Status(ctx)
			return err == nil && st.Waiting == 0
		}, 10*time.Second, 10*time.Millisecond, "the cancelled Wait left the queue")
		assert.Equal(t, 1, st.Started)
		assert.Equal(t, 0, st.Available)

		// Starts whose time is up are Due until a script puts them back.
		// One start of both units: two starts could be a window apart on a
		// loaded machine, and the second would put the first back.
		quick := newGate(t, b, "quick", 2, 20*time.Millisecond)
		_, err = quick.AllowN(ctx, 2)
		require.NoError(t, err)
		time.Sleep(50 * time.Millisecond)
		st, err = quick.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 0, st.Started)
		assert.Equal(t, 2, st.Due)
		assert.Equal(t, 0, st.Available)

		none := newGate(t, b, "never", 1, time.Second)
		st, err = none.Status(ctx)
		require.NoError(t, err)
		assert.False(t, st.Exists)
		assert.Zero(t, st.Limit)
	})
}
