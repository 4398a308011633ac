package redsem

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// Every kind of blocking wait (Acquire on a connection of its own, Acquire
// with shared waiting, AcquireN, a rate gate's Wait, an RWMutex's Lock)
// runs the one driver,
// and so keeps one bound: when its context ends while Redis does not answer
// at all (the server is stopped with SIGSTOP), it returns within
// engine.SettleWait of that end, plus scheduling. Once Redis answers again,
// the settling that went on in the background has left nothing behind.
func TestCancelledWaitsShareOneBound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pool := &redis.Pool{MaxIdle: 16, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", srv.Addr)
	}}
	t.Cleanup(func() { pool.Close() })
	ctx := ctxT(t, time.Minute)

	newS := func(name string, size int, opts ...Option) *Semaphore {
		s, err := NewSemaphore(pool, name, size, opts...)
		require.NoError(t, err)
		return s
	}
	own := newS("bound-own", 1, WithWaitConnections(0), WithFixedTTL())
	shared := newS("bound-shared", 1, WithFixedTTL())
	weighted := newS("bound-n", 3, WithFixedTTL())
	gate, err := rate.New(pool, "bound-rate", 1, time.Minute)
	require.NoError(t, err)
	rw, err := NewRWMutex(pool, "bound-rw", WithFixedTTL())
	require.NoError(t, err)

	// Take everything, so that every wait below blocks in Redis.
	for _, s := range []*Semaphore{own, shared} {
		_, err := s.TryAcquire(ctx)
		require.NoError(t, err)
	}
	_, err = weighted.TryAcquireN(ctx, 2)
	require.NoError(t, err)
	_, err = gate.Allow(ctx)
	require.NoError(t, err)
	_, err = rw.TryRLock(ctx)
	require.NoError(t, err)

	waits := map[string]func(context.Context) error{
		"Acquire":        func(c context.Context) error { _, err := own.Acquire(c); return err },
		"Acquire/shared": func(c context.Context) error { _, err := shared.Acquire(c); return err },
		"AcquireN":       func(c context.Context) error { _, err := weighted.AcquireN(c, 2); return err },
		"rate.Wait":      func(c context.Context) error { _, err := gate.Wait(c); return err },
		"RWMutex.Lock":   func(c context.Context) error { _, err := rw.Lock(c); return err },
	}
	// Should a wait hang, resume the server eventually so the test ends.
	watchdog := time.AfterFunc(20*time.Second, func() { _ = srv.Signal(syscall.SIGCONT) })
	defer watchdog.Stop()

	type outcome struct {
		name string
		late time.Duration
		err  error
	}
	done := make(chan outcome, len(waits))
	wctx, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
	defer cancel()
	deadline, _ := wctx.Deadline()
	for name, wait := range waits {
		go func() {
			err := wait(wctx)
			done <- outcome{name, time.Since(deadline), err}
		}()
	}
	// Every wait is blocked in Redis; then Redis stops answering.
	b := &backend{name: "redis", pool: pool, addr: srv.Addr, srv: srv}
	require.Eventually(t, func() bool { return blockedClients(t, b) >= len(waits) },
		5*time.Second, 10*time.Millisecond, "every wait blocks in Redis")
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	for range waits {
		o := <-done
		assert.ErrorIs(t, o.err, context.DeadlineExceeded, o.name)
		assert.Less(t, o.late, engine.SettleWait+time.Second, "%s returned %v after its context's deadline", o.name, o.late)
	}
	require.NoError(t, srv.Signal(syscall.SIGCONT))

	// The settling went on in the background: nobody is left waiting.
	require.Eventually(t, func() bool {
		for _, s := range []*Semaphore{own, shared, weighted} {
			if st, err := s.Status(ctx); err != nil || st.Waiting != 0 {
				return false
			}
		}
		if st, err := rw.Status(ctx); err != nil || len(st.Queue) != 0 {
			return false
		}
		st, err := gate.Status(ctx)
		return err == nil && st.Waiting == 0 && blockedClients(t, b) == 0
	}, 15*time.Second, 20*time.Millisecond, "a cancelled wait left something behind")
}
