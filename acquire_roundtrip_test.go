package redsem

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countPool counts client round trips: each Do (with or without a context or
// timeout) and each Flush of pipelined commands is one write the client then
// waits on.
type countPool struct {
	Pool
	trips atomic.Int64
}

func (p *countPool) GetContext(ctx context.Context) (redis.Conn, error) {
	c, err := p.Pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	return &countConn{Conn: c, p: p}, nil
}

type countConn struct {
	redis.Conn
	p *countPool
}

func (c *countConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	c.p.trips.Add(1)
	return c.Conn.Do(cmd, args...)
}

func (c *countConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	c.p.trips.Add(1)
	return redis.DoContext(c.Conn, ctx, cmd, args...)
}

func (c *countConn) Flush() error {
	c.p.trips.Add(1)
	return c.Conn.Flush()
}

func (c *countConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

func (c *countConn) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.Conn, d)
}

func (c *countConn) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	c.p.trips.Add(1)
	return redis.DoWithTimeout(c.Conn, d, cmd, args...)
}

// The round trips docs/api.md and docs/redis.md promise, counted against a real redis-server:
// an uncontended Acquire, a TryAcquire and a Release are one each; a waiter
// served by a Release spends one write on the fast path and one on its wait.
func TestSemaphore_Acquire_roundTrips(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 10*time.Second)
	cp := &countPool{Pool: b.pool}
	s, err := NewSemaphore(cp, "trips", 1)
	require.NoError(t, err)
	count := func(f func()) int64 {
		before := cp.trips.Load()
		f()
		return cp.trips.Load() - before
	}
	// The first call of each script on a server costs one more round trip
	// (EVALSHA answers NOSCRIPT, then EVAL loads it); count the steady state.
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, l.Refresh(ctx, time.Minute))
	require.NoError(t, l.Release(ctx))
	assert.Equal(t, int64(1), count(func() { l, err = s.Acquire(ctx); require.NoError(t, err) }), "uncontended Acquire")
	assert.Equal(t, int64(1), count(func() { require.NoError(t, l.Release(ctx)) }), "Release")
	assert.Equal(t, int64(1), count(func() { l, err = s.TryAcquire(ctx); require.NoError(t, err) }), "TryAcquire")
	assert.Equal(t, int64(1), count(func() { require.NoError(t, l.Refresh(ctx, time.Minute)) }), "Refresh")

	// A blocked Acquire: the fast path, then one pipelined wait, whether it
	// waits on a connection of its own or (the default) through the shared
	// pump, which goes on from the first waiter's fast path.
	for _, c := range []struct {
		conns int
		want  int64
	}{{0, 2}, {1, 2}} {
		wp := &countPool{Pool: b.pool}
		ws, err := NewSemaphore(wp, "trips", 1, WithWaitConnections(c.conns))
		require.NoError(t, err)
		got := acquireAsync(ctx, ws.Acquire)
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 5*time.Second, time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, l.Release(ctx))
		w, ok := <-got
		require.True(t, ok)
		assert.Equal(t, c.want, wp.trips.Load(), "blocked Acquire, %d wait connections", c.conns)
		l = w
	}
	require.NoError(t, l.Release(ctx))
}

// WithBlockingPool: the blocking wait runs on its own pool, the try, the
// release and everything else on the main one.
func TestSemaphore_WithBlockingPool_carriesTheWait(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 10*time.Second)
	holder := newSem(t, b, "split", 1)
	held, err := holder.Acquire(ctx)
	require.NoError(t, err)
	mainPool, blockPool := &countPool{Pool: b.pool}, &countPool{Pool: b.pool}
	for _, conns := range []int{0, 1} {
		s, err := NewSemaphore(mainPool, "split", 1, WithBlockingPool(blockPool), WithWaitConnections(conns))
		require.NoError(t, err)
		m0, b0 := mainPool.trips.Load(), blockPool.trips.Load()
		got := acquireAsync(ctx, s.Acquire)
		require.Eventually(t, func() bool { return blockPool.trips.Load() > b0 }, 5*time.Second, time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, held.Release(ctx))
		l, ok := <-got
		require.True(t, ok)
		b1 := blockPool.trips.Load()
		require.NoError(t, l.Release(ctx))
		assert.Equal(t, b1, blockPool.trips.Load(), "Release does not use the blocking pool")
		assert.Greater(t, mainPool.trips.Load(), m0, "the release went through the main pool")
		held, err = holder.Acquire(ctx)
		require.NoError(t, err)
	}
	require.NoError(t, held.Release(ctx))
}
