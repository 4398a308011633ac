package redsem

import (
	"context"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Release after Redis restarted without persistence, while another client
// holds the same slot of the semaphore created afresh (a new epoch): the old
// holder's pooled connection is dead, the retry on a fresh one finds no
// lease, and that must not pass for "the first attempt released it". The
// release reports ErrLeaseLost and leaves the new holder alone.
func TestLease_Release_afterRestartWithoutPersistenceIsLost(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 20*time.Second)
	old := newSem(t, b, "restart-release", 1)
	l, err := old.Acquire(ctx)
	require.NoError(t, err)
	require.True(t, l.Valid())

	b.srv.Restart() // --save "" --appendonly no: the data is gone
	other, err := NewSemaphore(b.srv.Pool(t), "restart-release", 1)
	require.NoError(t, err)
	l2, err := other.TryAcquire(ctx)
	require.NoError(t, err)
	require.NotEqual(t, l.Token(), l2.Token(), "a new epoch")
	require.True(t, l.Valid(), "the old lease's local deadline has not passed")

	require.ErrorIs(t, l.Release(ctx), ErrLeaseLost)
	assert.ErrorIs(t, l.Err(), ErrLeaseLost)
	requireInventory(t, other, 0, 1)
	require.NoError(t, l2.Release(ctx))
	requireInventory(t, other, 1, 0)
}

// `defer l.Release(ctx)` is the usual pattern, and by the time it runs ctx
// has often ended (the work's timeout passed, or it was cancelled): the
// release must still give the token back instead of failing with ctx's
// error and leaving the slot held until the TTL.
func TestLease_Release_withEndedContextFreesTheSlot(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		s := newSem(t, b, "release-ended", 1)
		for _, end := range []string{"cancelled", "deadline passed"} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			l, err := s.Acquire(ctx)
			require.NoError(t, err, end)
			if end == "cancelled" {
				cancel()
			} else {
				dctx, dcancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
				defer dcancel()
				ctx = dctx
			}
			require.Error(t, ctx.Err(), end)
			require.NoError(t, l.Release(ctx), end)
			assert.ErrorIs(t, l.Err(), ErrReleased, end)
			requireInventory(t, s, 1, 0)
			cancel()
		}
	})
}

// A shrink sends releases through the slow path (the holders "slow" field,
// see internal/engine/lua/release_fast.lua) only while it drains: once the retired leases
// are back, the next release drops the field, the semaphore is whole again
// and its keys are what they were before the shrink.
func TestLease_Release_fastPathAfterShrink(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "fast-after-shrink", 3, WithAdoptSize(), WithFixedTTL())
		held := takeAll(t, ctx, s)
		require.Len(t, held, 3)
		require.NoError(t, s.Resize(ctx, 2))
		slow := func() bool {
			n, err := redis.Int(b.do(t, "HEXISTS", s.k.holders, "slow"), nil)
			require.NoError(t, err)
			return n == 1
		}
		assert.True(t, slow(), "a shrink with a retired lease out marks releases slow")
		require.NoError(t, held[3].Release(ctx)) // the retired slot
		assert.True(t, slow(), "the field goes with a release that finds the shrink over")
		require.NoError(t, held[1].Release(ctx))
		assert.False(t, slow(), "the shrink is over: releases take the fast path again")
		require.NoError(t, held[2].Release(ctx))
		n, err := redis.Int(b.do(t, "EXISTS", s.k.holders, s.k.leases), nil)
		require.NoError(t, err)
		assert.Zero(t, n, "no holder record, lease or field is left")
		requireInventory(t, s, 2, 0)
	})
}

// Release with an ended context is bounded by a timeout of its own: against
// a server that stopped answering it returns an error within
// releaseTimeout (and a lease with auto-refresh on the wire stops as
// promptly), and the slot comes back by the lease's TTL once Redis answers.
func TestLease_Release_againstHungServerIsBounded(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	for _, mode := range []struct {
		name string
		opts []Option
	}{
		{"fixed lease", []Option{WithFixedTTL(), WithTTL(time.Second)}},
		{"auto-refresh", []Option{WithTTL(300 * time.Millisecond)}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			s := newSem(t, b, "release-hung-"+strings.ReplaceAll(mode.name, " ", "-"), 1, mode.opts...)
			l, err := s.Acquire(ctxT(t, 30*time.Second))
			require.NoError(t, err)
			time.Sleep(150 * time.Millisecond) // auto-refresh's first call is near
			require.NoError(t, b.srv.Signal(syscall.SIGSTOP))
			var resumed atomic.Bool
			watchdog := time.AfterFunc(60*time.Second, func() { resumed.Store(true); _ = b.srv.Signal(syscall.SIGCONT) })
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // as in `defer lease.Release(ctx)` after ctx ended
			start := time.Now()
			err = l.Release(ctx)
			took := time.Since(start)
			watchdog.Stop()
			require.NoError(t, b.srv.Signal(syscall.SIGCONT))
			assert.Error(t, err, "Redis never answered")
			t.Logf("Release took %v (releaseTimeout %v)", took, releaseTimeout)
			assert.False(t, resumed.Load(), "Release waited for Redis to answer again")
			assert.False(t, l.Valid())
			l2, err := s.Acquire(ctxT(t, 30*time.Second))
			require.NoError(t, err, "the slot is free again once the lease ran out")
			require.NoError(t, l2.Release(context.Background()))
		})
	}
}

// FM-06: double release must never add a token.
func TestLease_Release_twiceAddsNoToken(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "double", 2)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		require.ErrorIs(t, l.Release(ctx), ErrReleased)
		require.ErrorIs(t, l.Refresh(ctx, time.Second), ErrReleased)

		// Concurrently, from two goroutines: exactly one succeeds.
		l, err = s.Acquire(ctx)
		require.NoError(t, err)
		errs := make(chan error, 2)
		for i := 0; i < 2; i++ {
			go func() { errs <- l.Release(ctx) }()
		}
		e1, e2 := <-errs, <-errs
		assert.True(t, (e1 == nil) != (e2 == nil), "exactly one release succeeds: %v, %v", e1, e2)
		assert.Equal(t, 2, b.llen(t, s.k.tokens))
		requireInventory(t, s, 2, 0)

		var nilLease *Lease
		assert.ErrorIs(t, nilLease.Release(ctx), ErrLeaseLost)
		assert.ErrorIs(t, nilLease.Refresh(ctx, time.Second), ErrLeaseLost)
		assert.False(t, nilLease.Valid())
	})
}
