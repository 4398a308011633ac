package redsem

import (
	"fmt"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstLayout turns s's meta record into what redsem wrote before protocol
// v2: the epoch in meta's epoch field instead of gen. Every other key of
// that layout is stored as this one stores it.
func firstLayout(t *testing.T, b *backend, s *Semaphore) {
	t.Helper()
	epoch := b.read(t, "HGET", s.k.meta, "gen")
	require.NotNil(t, epoch)
	b.do(t, "HSET", s.k.meta, "epoch", epoch)
	b.do(t, "HDEL", s.k.meta, "gen")
}

// A name of the layout before protocol v2 that nobody uses is moved to v2
// by the next acquisition: its epoch becomes gen, which the clients of that
// layout do not read, so they refuse the name from then on.
func TestLayout_anIdleNameOfTheFirstLayoutIsUpgraded(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "up-idle", 2)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		fence := l.Fence()
		require.NoError(t, l.Release(ctx))
		firstLayout(t, b, s)
		epoch := b.read(t, "HGET", s.k.meta, "epoch")

		// Check reads it as it is; an admin command that is no acquisition
		// refuses it. Neither writes.
		before := b.snapshot(t)
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Healthy(), "%+v", inv)
		_, err = s.handle().Reclaim(ctx)
		require.ErrorIs(t, err, engine.ErrLayout)
		assert.Equal(t, before, b.snapshot(t), "Check or Reclaim wrote")
		// A client that asks for another size is told so, and moves nothing.
		_, err = newSem(t, b, "up-idle", 3).TryAcquire(ctx)
		require.ErrorIs(t, err, ErrSizeMismatch)
		assert.Equal(t, before, b.snapshot(t), "an acquisition of another size wrote")

		l, err = s.Acquire(ctx)
		require.NoError(t, err)
		assert.Greater(t, l.Fence(), fence)
		assert.Equal(t, epoch, b.read(t, "HGET", s.k.meta, "gen"), "the epoch moves to gen")
		assert.Nil(t, b.read(t, "HGET", s.k.meta, "epoch"), "a client of the first layout finds no epoch")
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 2, 0)
	})
}

// While a client of the first layout holds a lease or waits, a v2 client
// refuses the name with ErrWrongType, saying what to do, and writes
// nothing; once what they left has lapsed, the next acquisition upgrades
// the name and the sweep gives back the lapsed lease's token.
func TestLayout_aNameInUseByTheFirstLayoutIsRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "up-busy", 1)
		held, err := s.Acquire(ctx)
		require.NoError(t, err)
		firstLayout(t, b, s)

		before := b.snapshot(t)
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrWrongType)
		require.ErrorIs(t, err, engine.ErrLayout)
		assert.Contains(t, err.Error(), "before protocol v2")
		_, err = s.TryAcquireN(ctx, 1)
		require.ErrorIs(t, err, engine.ErrLayout)
		assert.Equal(t, before, b.snapshot(t), "a refused acquisition wrote")

		// The lease lapses a second ago (due, the earliest deadline, with it);
		// a waiter of the first layout still waits.
		b.lapse(t, s, held.Token())
		now := serverMillis(t, b)
		waiter := "w:0123456789abcdef0123456789abcdef"
		b.do(t, "ZADD", s.k.waits, now+60000, waiter)
		before = b.snapshot(t)
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrWrongType, "a registered waiter of the first layout")
		assert.Equal(t, before, b.snapshot(t), "a refused acquisition wrote")
		// Its registration lapses too; a tombstone of an aborted acquisition
		// uses nothing.
		b.do(t, "ZADD", s.k.waits, now-1000, waiter)
		// A thousand live tombstones of aborted acquisitions are more than
		// the upgrade reads through: it tries again once they lapse.
		tombs := []interface{}{s.k.waits}
		for i := 0; i < 1000; i++ {
			tombs = append(tombs, now+60000, fmt.Sprintf("x:%032d", i))
		}
		b.do(t, "ZADD", tombs...)
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, engine.ErrLayout, "a thousand live tombstones")
		b.do(t, "ZREMRANGEBYRANK", s.k.waits, 1, -1)
		require.Equal(t, 1, b.zcard(t, s.k.waits))
		b.do(t, "ZADD", s.k.waits, now+60000, "x:fedcba9876543210fedcba9876543210")

		l, err := s.TryAcquire(ctx)
		require.NoError(t, err, "nothing of the first layout is live")
		assert.Equal(t, held.Token(), l.Token(), "the lapsed lease's token, swept")
		assert.ErrorIs(t, held.Release(ctx), ErrLeaseLost)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// serverMillis is the backend's TIME in ms.
func serverMillis(t *testing.T, b *backend) int64 {
	t.Helper()
	now, err := redis.Int64s(b.do(t, "TIME"), nil)
	require.NoError(t, err)
	return now[0]*1000 + now[1]/1000
}
