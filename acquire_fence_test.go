package redsem

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/rate"
)

// A fence in meta so large that adding one no longer changes a double
// (2^53 and above) can only be corruption: every script that reads or
// writes the fence refuses it with ErrCorrupt and writes nothing, so no two
// grants ever share a fence (issue 11, bug 7).
func TestSemaphore_Acquire_fenceTooLargeIsCorrupt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, fence := range []string{"9007199254740992", "9007199254740993", "1e300", "9000000000000000"} {
			ctx := ctxT(t, 10*time.Second)
			s := newSem(t, b, "fence-"+fence, 3)
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			b.do(t, "HSET", s.k.meta, "fence", fence)
			before := b.snapshot(t)

			_, err = s.TryAcquire(ctx)
			assert.ErrorIs(t, err, ErrCorrupt, "TryAcquire, fence %s", fence)
			_, err = s.TryAcquireN(ctx, 2)
			assert.ErrorIs(t, err, ErrCorrupt, "TryAcquireN, fence %s", fence)
			actx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = s.Acquire(actx)
			cancel()
			assert.ErrorIs(t, err, ErrCorrupt, "Acquire, fence %s", fence)
			assert.Equal(t, before, b.snapshot(t), "nothing written, fence %s", fence)
			// A release does not read meta (no fence is granted): it gives
			// the token back and leaves the corrupt fence for acquisitions
			// to report.
			assert.NoError(t, l.Release(ctx), "Release, fence %s", fence)
			got, _ := redis.String(b.do(t, "HGET", s.k.meta, "fence"), nil)
			assert.Equal(t, fence, got, "fence %s left alone", fence)

			g, err := rate.New(b.pool, "fence-"+fence, 2, time.Second)
			require.NoError(t, err)
			_, err = g.Allow(ctx)
			require.NoError(t, err)
			b.do(t, "HSET", DefaultPrefix+"{fence-"+fence+"}:rate:meta", "fence", fence)
			before = b.snapshot(t)
			_, err = g.Allow(ctx)
			assert.ErrorIs(t, err, ErrCorrupt, "Allow, fence %s", fence)
			assert.Equal(t, before, b.snapshot(t), "nothing written by Allow, fence %s", fence)
		}
	})
}

// Fences keep growing right below the bound.
func TestSemaphore_Acquire_fenceGrowsBelowTheBound(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "fence-below", 2)
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		b.do(t, "HSET", s.k.meta, "fence", "8999999999999990")
		var last int64
		for i := 0; i < 5; i++ {
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			assert.Greater(t, l.Fence(), last)
			last = l.Fence()
			require.NoError(t, l.Release(ctx))
		}
		assert.Equal(t, int64(8999999999999995), last)
	})
}

// A server clock whose seconds are not ten digits (miniredis set near 1970)
// still gives every grant a fence above the last: TIME's digits are not
// compared with the stored fence's as strings then.
func TestSemaphore_Acquire_fenceGrowsWithAShortClock(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	b := &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
	ctx := ctxT(t, 10*time.Second)
	s := newSem(t, b, "fence-short-clock", 2)
	b.mini.SetTime(time.Unix(0, 790600*1000))
	l, err := s.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	for _, stored := range []string{"790600", "5", "999999"} {
		b.do(t, "HSET", s.k.meta, "fence", stored)
		b.mini.SetTime(time.Unix(0, 3000))
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		want, _ := strconv.ParseInt(stored, 10, 64)
		assert.Greater(t, l.Fence(), want, "stored fence %s", stored)
		require.NoError(t, l.Release(ctx))
	}
}

// A stored size that no client can have written (huge, or not whole) is
// corruption: the scripts that read it refuse it with ErrCorrupt and write
// nothing, and none loops over it (a size of 9e15 once froze check.lua and
// repair.lua, and the server with them).
func TestHandle_Check_sizeTooLargeIsCorrupt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, size := range []string{"9000000000000000", "100001", "2.5", "1e300"} {
			ctx := ctxT(t, 10*time.Second)
			s := newSem(t, b, "size-"+size, 3, WithAdoptSize())
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			b.do(t, "HSET", s.k.meta, "size", size)
			before := b.snapshot(t)

			_, err = s.Check(ctx)
			assert.ErrorIs(t, err, ErrCorrupt, "Check, size %s", size)
			_, err = s.Repair(ctx)
			assert.ErrorIs(t, err, ErrCorrupt, "Repair, size %s", size)
			_, err = s.TryAcquire(ctx)
			assert.ErrorIs(t, err, ErrCorrupt, "TryAcquire, size %s", size)
			assert.Equal(t, before, b.snapshot(t), "nothing written, size %s", size)
			_ = l.Release(ctx) // does not read meta: its outcome is not this test's
		}
	})
}

// A frozen server clock (every TIME the same) still gives every grant a
// fence above the last, whichever script grants it: the fast path, a
// waiter's acquire_fast.lua or acquire.lua (when a lease is due to be
// swept) behind its BLMOVE, a weighted collector's seal. Each writes its
// fence to meta, or the next grant repeats it.
func TestSemaphore_Acquire_fenceGrowsWithAFrozenClock(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	b := &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
	ctx := ctxT(t, 10*time.Second)
	m.SetTime(time.Unix(1700000000, 0))
	s := newSem(t, b, "fence-frozen", 2)
	var last int64
	next := func(l *Lease, err error, how string) *Lease {
		t.Helper()
		require.NoError(t, err, how)
		require.Greater(t, l.Fence(), last, how)
		last = l.Fence()
		return l
	}
	// served waits behind held, released once the waiter is registered
	// (and then the clock set to at, if not zero).
	served := func(held *Lease, at time.Time, wait func(context.Context) (*Lease, error)) (*Lease, error) {
		type result struct {
			l   *Lease
			err error
		}
		done := make(chan result, 1)
		go func() {
			l, err := wait(ctx)
			done <- result{l, err}
		}()
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 5*time.Second, time.Millisecond)
		if !at.IsZero() {
			m.SetTime(at)
		}
		require.NoError(t, held.Release(ctx))
		r := <-done
		return r.l, r.err
	}
	l, err := s.TryAcquire(ctx)
	a := next(l, err, "fast")
	l, err = s.TryAcquire(ctx)
	c := next(l, err, "fast")
	l, err = served(a, time.Time{}, s.Acquire)
	w := next(l, err, "a waiter")
	require.NoError(t, c.Release(ctx))
	l, err = s.TryAcquire(ctx)
	require.NoError(t, next(l, err, "fast after a waiter").Release(ctx))
	l, err = served(w, time.Time{}, func(ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, 2) })
	require.NoError(t, next(l, err, "a weighted waiter").Release(ctx))
	l, err = s.TryAcquire(ctx)
	require.NoError(t, next(l, err, "fast after a weighted waiter").Release(ctx))

	// A lease expires (the clock jumps past it) while a waiter waits: the
	// fast path leaves the waiter's grant to acquire.lua, which sweeps first.
	short := newSem(t, b, "fence-frozen", 2, WithTTL(time.Second))
	l, err = short.TryAcquire(ctx)
	lapsed := next(l, err, "fast, short")
	l, err = s.TryAcquire(ctx)
	c = next(l, err, "fast")
	l, err = served(c, time.Unix(1700000002, 0), s.Acquire)
	require.NoError(t, next(l, err, "a waiter after a sweep").Release(ctx))
	l, err = s.TryAcquire(ctx)
	require.NoError(t, next(l, err, "fast after a sweep").Release(ctx))
	require.ErrorIs(t, lapsed.Release(ctx), ErrLeaseLost)
}
