package redsem

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FM-07, FM-08, FM-09: a holder that stalls past its lease loses it. Its
// token is reclaimed and handed on; its late Release and Refresh fail with
// ErrLeaseLost and push nothing.
func TestLease_Valid_stalledHolderLosesLease(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "stall", 1, WithTTL(150*time.Millisecond), WithFixedTTL())
		stale, err := s.Acquire(ctx)
		require.NoError(t, err)
		time.Sleep(200 * time.Millisecond)
		assert.False(t, stale.Valid(), "Valid reads the clock: false past the deadline")
		<-stale.Done()
		assert.ErrorIs(t, stale.Err(), ErrLeaseExpired)
		assert.ErrorIs(t, stale.Refresh(ctx, time.Second), ErrLeaseExpired, "FM-09: no refresh after expiry")

		// The next holder's lease is long: with 150ms a loaded machine let
		// it expire too before the TryAcquire below, which then got it.
		long := newSem(t, b, "stall", 1, WithTTL(10*time.Second), WithFixedTTL())
		next, err := long.Acquire(ctx) // reclaims the expired lease on the way
		require.NoError(t, err)
		assert.Equal(t, stale.Token(), next.Token())
		assert.Greater(t, next.Fence(), stale.Fence())

		require.ErrorIs(t, stale.Release(ctx), ErrLeaseLost, "FM-07: release after reclaim")
		assert.Equal(t, 0, b.llen(t, s.k.tokens), "no second copy of the token")
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		require.NoError(t, next.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// FM-17: leases are timed by Redis TIME alone. A client whose view of time
// is an hour off from the server's still gets a local deadline one TTL
// ahead on its own clock, and expiry follows the server's clock.
func TestLease_Deadline_serverClockDecidesExpiry(t *testing.T) {
	t.Parallel()
	b := &backend{name: "miniredis"}
	eachBackend := func(f func()) { f() }
	eachBackend(func() {
		m := miniredisT(t)
		b.mini, b.addr, b.pool = m, m.Addr(), newPool(t, m.Addr())
	})
	ctx := ctxT(t, 10*time.Second)
	skew := time.Hour
	b.mini.SetTime(time.Now().Add(skew))
	s := newSem(t, b, "skew", 1, WithTTL(10*time.Second))
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(10*time.Second), l.Deadline(), time.Second, "local deadline is one TTL on the local clock")
	st, err := s.Status(ctx)
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(skew+10*time.Second), st.Holders[0].Deadline, time.Second, "server deadline is on the server clock")
	// The server's clock passes the deadline: the lease is reclaimed by the
	// next client even though no client clock moved.
	b.mini.SetTime(time.Now().Add(skew + 11*time.Second))
	n, err := s.Reclaim(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.ErrorIs(t, l.Refresh(ctx, time.Second), ErrLeaseLost)
}
