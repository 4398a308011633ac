package redsem

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// registered counts the waiters registered in s's waits (not tombstones).
func registered(t *testing.T, b *backend, s *Semaphore) int {
	return prefixedMembers(t, b.pool.Get(), s.k.waits, "w:")
}

// waitOnce makes w wait once behind a holder of s (size 1), so that its
// next Acquire writes its registration with its wait; it returns the
// holder's lease, taken again after w's.
func waitOnce(t *testing.T, ctx context.Context, b *backend, s, w *Semaphore) *Lease {
	t.Helper()
	held, err := s.Acquire(ctx)
	require.NoError(t, err)
	got := acquireAsync(ctx, w.Acquire)
	require.Eventually(t, func() bool { return registered(t, b, s) == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, held.Release(ctx))
	l, ok := <-got
	require.True(t, ok, "the waiter got no lease")
	require.NoError(t, l.Release(ctx))
	held, err = s.Acquire(ctx)
	require.NoError(t, err)
	return held
}

// Contended, an Acquire that follows one that waited is one round trip:
// register.lua, BLMOVE and acquire.lua in one write, with a connection of
// its own and with shared waiting; with the Release that hands it the
// token, two a pair, as the raw BLPOP/LPUSH pass.
func TestSemaphore_Acquire_queuedIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	s := newSem(t, b, "queued-trips", 1)
	for _, conns := range []int{0, 1} {
		wp := &countPool{Pool: b.pool}
		w, err := NewSemaphore(wp, "queued-trips", 1, WithWaitConnections(conns))
		require.NoError(t, err)
		held := waitOnce(t, ctx, b, s, w)
		before := wp.trips.Load()
		got := acquireAsync(ctx, w.Acquire)
		require.Eventually(t, func() bool { return registered(t, b, s) == 1 }, 10*time.Second, time.Millisecond)
		require.NoError(t, held.Release(ctx))
		l, ok := <-got
		require.True(t, ok)
		assert.Equal(t, int64(1), wp.trips.Load()-before, "a queued Acquire, %d wait connections", conns)
		require.NoError(t, l.Release(ctx))
	}
	requireInventory(t, s, 1, 0)
}

// The registration refuses when what the waiter knew is stale: the
// semaphore was deleted, or made again with another size. The BLMOVE
// behind it then never waits (its connection is dropped), and the
// acquisition starts over with acquire.lua: it creates the semaphore, or
// says the size differs. Nothing is left behind.
func TestSemaphore_Acquire_queuedRegistrationRefused(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	s := newSem(t, b, "queued-refused", 1)
	w := newSem(t, b, "queued-refused", 1)

	held := waitOnce(t, ctx, b, s, w)
	require.NoError(t, held.Release(ctx))
	b.do(t, "DEL", s.k.meta, s.k.tokens, s.k.leases, s.k.holders, s.k.waits)
	l, err := w.Acquire(ctx)
	require.NoError(t, err, "after the name was deleted")
	require.NoError(t, l.Release(ctx))
	requireInventory(t, s, 1, 0)

	held = waitOnce(t, ctx, b, s, w)
	require.NoError(t, held.Release(ctx))
	b.do(t, "DEL", s.k.meta, s.k.tokens, s.k.leases, s.k.holders, s.k.waits)
	other := newSem(t, b, "queued-refused", 2)
	ol, err := other.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, ol.Release(ctx))
	_, err = w.Acquire(ctx)
	var mismatch *SizeMismatchError
	require.True(t, errors.As(err, &mismatch), "a size made again differently: %v", err)
	assert.Zero(t, registered(t, b, s), "registrations left")
	keys, err := redis.Strings(b.do(t, "KEYS", s.k.base+"pend:*"), nil)
	require.NoError(t, err)
	assert.Empty(t, keys, "pending lists left")
}

// A queued waiter blocks no longer than the earliest lease deadline Redis
// last told it of: a holder that died is reclaimed by the waiter itself.
func TestSemaphore_Acquire_queuedWakesForADeadHolder(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 60*time.Second)
	s := newSem(t, b, "queued-dead", 1, WithTTL(2*time.Second), WithFixedTTL())
	w := newSem(t, b, "queued-dead", 1, WithTTL(2*time.Second), WithFixedTTL())
	held := waitOnce(t, ctx, b, s, w)
	_ = held // its holder "dies": never released, never refreshed
	got := acquireAsync(ctx, w.Acquire)
	l, ok := <-got
	require.True(t, ok, "the queued waiter never got the dead holder's token")
	assert.NotEqual(t, held.Fence(), l.Fence())
	require.NoError(t, l.Release(ctx))
}

// A waiter's grant ends its registration: behind the BLMOVE the token it
// holds is off waits, whether the call behind the move took the common
// path or swept first (meta's due passed: an early due only brings a
// sweep forward), so that status never counts a holder as waiting.
func TestSemaphore_Acquire_grantEndsTheRegistration(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, sweep := range []bool{false, true} {
			t.Run(fmt.Sprintf("sweep=%v", sweep), func(t *testing.T) {
				ctx := ctxT(t, 30*time.Second)
				name := fmt.Sprintf("grant-ends-registration-%v", sweep)
				s := newSem(t, b, name, 1, WithTTL(time.Minute))
				w := newSem(t, b, name, 1, WithTTL(time.Minute), WithWaitConnections(0))
				held, err := s.Acquire(ctx)
				require.NoError(t, err)
				got := acquireAsync(ctx, w.Acquire)
				require.Eventually(t, func() bool { return registered(t, b, s) == 1 && blockedClients(t, b) == 1 },
					10*time.Second, time.Millisecond)
				if sweep {
					b.do(t, "HSET", s.k.meta, "due", 0)
				}
				require.NoError(t, held.Release(ctx))
				l, ok := <-got
				require.True(t, ok, "the waiter got no lease")
				assert.Zero(t, registered(t, b, s), "the holder is still registered as waiting")
				st, err := s.Status(ctx)
				require.NoError(t, err)
				assert.Equal(t, 0, st.Waiting)
				assert.Len(t, st.Holders, 1)
				require.NoError(t, l.Release(ctx))
			})
		}
	})
}
