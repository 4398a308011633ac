package rate

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A blocked Wait counts as waiting in the gate's status until it leaves.
func TestStatusCountsWaiters(t *testing.T) {
	t.Parallel()
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
		assert.Equal(t, 2, st.Available, "due units are the next start's")

		none := newGate(t, b, "never", 1, time.Second)
		st, err = none.Status(ctx)
		require.NoError(t, err)
		assert.False(t, st.Exists)
		assert.Zero(t, st.Limit)
	})
}

// Units whose window has passed but that no script has let go yet are
// available: Status says what the next AllowN can take, no more, no less.
func TestStatusAvailableCountsDueUnits(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	b := &backend{name: "miniredis", addr: m.Addr(), mini: m}
	b.pool = &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", m.Addr()) }}
	t.Cleanup(func() { b.pool.Close() })
	ctx := ctxT(t, 10*time.Second)
	m.SetTime(time.UnixMicro(1_700_000_000_000_000))
	g := newGate(t, b, "api", 5, time.Second)
	_, err := g.AllowN(ctx, 2)
	require.NoError(t, err)
	m.SetTime(time.UnixMicro(1_700_000_000_500_000))
	_, err = g.Allow(ctx)
	require.NoError(t, err)

	m.SetTime(time.UnixMicro(1_700_000_001_200_000)) // the first two are due
	st, err := g.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, [3]int{1, 2, 4}, [3]int{st.Started, st.Due, st.Available}, "started, due, available")
	require.Len(t, st.Limits, 1)
	assert.Equal(t, st.Available, st.Limits[0].Available)
	_, err = g.AllowN(ctx, st.Available+1)
	require.ErrorIs(t, err, ErrRateLimited, "no more than Available")
	_, err = g.AllowN(ctx, st.Available)
	require.NoError(t, err, "all of Available")
}
