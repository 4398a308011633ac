package redsem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// TestEveryPooledConnectionKilled: CLIENT KILL of every connection of a
// pool holding 8 idle ones (as after a Redis restart, or a proxy that cut
// them) must not turn the next call into a bare EOF. Each call either
// succeeds or gives its lease-level answer, while Redis is reachable.
func TestEveryPooledConnectionKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pool := &redis.Pool{
		MaxIdle: 8,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", srv.Addr, redis.DialConnectTimeout(2*time.Second))
		},
	}
	t.Cleanup(func() { pool.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// killAll fills the pool with 8 idle connections, then kills every one.
	killAll := func() {
		t.Helper()
		var conns []redis.Conn
		for len(conns) < 8 {
			c, err := pool.GetContext(ctx)
			require.NoError(t, err)
			if _, err := c.Do("ECHO", "warm"); err != nil {
				c.Close() // dead from the last kill: the pool drops it
				continue
			}
			conns = append(conns, c)
		}
		for _, c := range conns {
			require.NoError(t, c.Close())
		}
		require.Equal(t, 8, pool.Stats().IdleCount)
		n, err := redis.Int(srv.Do(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"), nil)
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 8)
	}

	sem, err := redsem.NewSemaphore(pool, "killed", 3)
	require.NoError(t, err)
	gate, err := rate.New(pool, "killed", 100, time.Second)
	require.NoError(t, err)
	h, err := admin.New(pool, redsem.DefaultPrefix, "killed")
	require.NoError(t, err)

	lease, err := sem.TryAcquire(ctx)
	require.NoError(t, err)

	steps := []struct {
		name string
		call func() error
	}{
		{"Lease.Refresh", func() error { return lease.Refresh(ctx, 30*time.Second) }},
		{"Handle.Status", func() error { _, err := h.Status(ctx); return err }},
		{"Semaphore.TryAcquire", func() error {
			l, err := sem.TryAcquire(ctx)
			if err == nil {
				err = l.Release(ctx)
			}
			return err
		}},
		{"Semaphore.Acquire", func() error {
			l, err := sem.Acquire(ctx)
			if err == nil {
				err = l.Release(ctx)
			}
			return err
		}},
		{"Gate.Allow", func() error { _, err := gate.Allow(ctx); return err }},
		{"Gate.Wait", func() error { _, err := gate.Wait(ctx); return err }},
		{"Gate.Status", func() error { _, err := gate.Status(ctx); return err }},
		{"Gate.SetRate", func() error { return gate.SetRate(ctx, 100, time.Second) }},
		{"Lease.Release", func() error { return lease.Release(ctx) }},
	}
	for _, s := range steps {
		killAll()
		require.NoError(t, s.call(), "%s after every pooled connection was killed", s.name)
	}

	// A lease whose release is the first call after the kill, twice: the
	// second Release says it was released, not a connection error.
	l, err := sem.TryAcquire(ctx)
	require.NoError(t, err)
	killAll()
	require.NoError(t, l.Release(ctx))
	killAll()
	require.ErrorIs(t, l.Release(ctx), redsem.ErrReleased)

	// Many callers at once after the kill.
	killAll()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.Status(ctx)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// A restart (no persistence) kills them too, and loses the lease: its
	// Release and Refresh say so rather than EOF.
	l, err = sem.TryAcquire(ctx)
	require.NoError(t, err)
	l2, err := sem.TryAcquire(ctx)
	require.NoError(t, err)
	killAll() // fills the pool; the restart below kills them again
	srv.Restart()
	require.ErrorIs(t, l.Refresh(ctx, 30*time.Second), redsem.ErrLeaseLost)
	srv.Restart()
	require.ErrorIs(t, l2.Release(ctx), redsem.ErrLeaseLost)
	srv.Restart()
	_, err = gate.Status(ctx)
	require.NoError(t, err)
}
