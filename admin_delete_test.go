package redsem

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHandle_Delete_basics(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "deleted", 2)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, s.Delete(ctx))
		assert.Equal(t, 0, b.keyCount(t))
		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.False(t, st.Exists)
		require.ErrorIs(t, l.Refresh(ctx, time.Second), ErrLeaseLost)
		require.ErrorIs(t, l.Release(ctx), ErrLeaseLost)

		// The next use recreates it under a new epoch; the old token is stray.
		l2, err := s.Acquire(ctx)
		require.NoError(t, err)
		assert.NotEqual(t, strings.Split(l.Token(), ":")[0], strings.Split(l2.Token(), ":")[0])
		b.do(t, "LPUSH", s.k.tokens, l.Token())
		require.NoError(t, l2.Release(ctx))
		st, err = s.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, st.Available)
		assert.Equal(t, 1, st.Stray)
	})
}

// Delete removes the weighted queue and doorbells too.
func TestHandle_Delete_removesWeightedKeys(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		// A waiter checks in every collectPoll: one that does between
		// Delete and the count finds no semaphore and creates it anew
		// (another epoch), as any acquirer would. Such a run tells
		// nothing, and is run again under another name.
		for attempt := 0; attempt < 5; attempt++ {
			if !deleteWithWeightedWaiters(t, b, fmt.Sprintf("del-weighted-%d", attempt)) {
				return
			}
		}
		t.Fatal("a waiter checked in between Delete and the count in every run")
	})
}

// deleteWithWeightedWaiters deletes a semaphore that a collector and a
// queued weighted waiter wait on and checks that nothing of it is left; it
// reports raced when a waiter created the semaphore again before the count.
func deleteWithWeightedWaiters(t *testing.T, b *backend, name string) (raced bool) {
	ctx := ctxT(t, 20*time.Second)
	s := newSem(t, b, name, 2)
	a, err := s.TryAcquire(ctx)
	require.NoError(t, err)
	c, err := s.TryAcquire(ctx)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := s.AcquireN(wctx, 2); first <- err }()
	require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) >= 1 }, 5*time.Second, time.Millisecond)
	second := make(chan error, 1)
	go func() { _, err := s.AcquireN(wctx, 2); second <- err }()
	require.Eventually(t, func() bool { return b.llen(t, s.k.wqueue()) == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	epoch, err := redis.String(b.read(t, "HGET", s.k.meta, "gen"), nil)
	require.NoError(t, err)
	require.NoError(t, s.Delete(ctx))
	keys, err := redis.Strings(b.read(t, "KEYS", "*{"+name+"}*"), nil)
	require.NoError(t, err)
	now, _ := redis.String(b.read(t, "HGET", s.k.meta, "gen"), nil)
	cancel()
	errFirst, errSecond := <-first, <-second
	if (len(keys) > 0 && now != "" && now != epoch) || errFirst == nil || errSecond == nil {
		// Even then, nothing of the deleted epoch is left.
		for _, read := range [][]interface{}{{"LRANGE", s.k.tokens, 0, -1}, {"ZRANGE", s.k.leases, 0, -1},
			{"HGETALL", s.k.holders}} {
			all, err := redis.Strings(b.read(t, read[0].(string), read[1:]...), nil)
			require.NoError(t, err)
			for _, v := range all {
				assert.NotContains(t, v, epoch+":", "%v: a token of the deleted epoch", read)
			}
		}
		return true
	}
	assert.Empty(t, keys, "nothing of the semaphore is left")
	assert.ErrorIs(t, errFirst, context.Canceled)
	assert.ErrorIs(t, errSecond, context.Canceled)
	assert.ErrorIs(t, a.Release(ctx), ErrLeaseLost)
	assert.ErrorIs(t, c.Release(ctx), ErrLeaseLost)
	return false
}
