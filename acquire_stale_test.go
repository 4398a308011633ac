package redsem

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// Grants that keep reaching the client after their lease's local deadline
// (here every acquire reply is delayed past the TTL) are given back, and an
// acquisition gives up with ErrStaleGrant after a few instead of looping on
// Redis until its context ends (for ever with context.Background).
func TestSemaphore_Acquire_staleGrantsDoNotLoop(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const ttl = 50 * time.Millisecond
		// plain loads the scripts and checks the inventory: a TTL no slow
		// round trip outlasts.
		plain := newSem(t, b, "stale-loop", 2, WithTTL(time.Minute))
		l, err := plain.TryAcquire(ctx) // loads the scripts: every later run is an EVALSHA
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		l, err = plain.TryAcquireN(ctx, 2)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))

		var grants atomic.Int64
		hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
			if isScript(engine.Acquire.Script, cmd, args) || isScript(engine.AcquireN.Script, cmd, args) {
				grants.Add(1)
				time.Sleep(2 * ttl)
			}
			return nil
		}}
		for _, mode := range grantModes {
			s, err := NewSemaphore(hp, "stale-loop", 2, append([]Option{WithTTL(ttl)}, mode.opts...)...)
			require.NoError(t, err)
			grants.Store(0)
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			l, err := mode.call(s, actx)
			cancel()
			assert.Nil(t, l, mode.name)
			assert.ErrorIs(t, err, ErrStaleGrant, mode.name)
			assert.EqualValues(t, engine.MaxStaleGrants, grants.Load(), "%s: acquire scripts run", mode.name)
			require.True(t, s.pumpsIdleWithin(5*time.Second), mode.name)
			requireInventory(t, plain, 2, 0)
		}
	})
}

// A stale grant is given back with a release that Redis may never answer
// (here the server is stopped right after the grant): the acquisition must
// still return within engine.SettleWait of its context's end, as a cancelled
// Acquire does, and the token is back once Redis answers again.
func TestSemaphore_Acquire_staleGrantReleaseDoesNotOutliveContext(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	const ttl = 100 * time.Millisecond
	plain := newSem(t, b, "stale-hang", 2, WithTTL(ttl))
	l, err := plain.TryAcquire(ctxT(t, 5*time.Second)) // loads the scripts
	require.NoError(t, err)
	require.NoError(t, l.Release(context.Background()))
	l, err = plain.TryAcquireN(ctxT(t, 5*time.Second), 2)
	require.NoError(t, err)
	require.NoError(t, l.Release(context.Background()))

	var armed atomic.Bool
	hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
		if (isScript(engine.Acquire.Script, cmd, args) || isScript(engine.AcquireN.Script, cmd, args)) && armed.Swap(false) {
			time.Sleep(2 * ttl) // the grant is stale on arrival
			_ = b.srv.Signal(syscall.SIGSTOP)
		}
		return nil
	}}
	for _, mode := range grantModes {
		s, err := NewSemaphore(hp, "stale-hang", 2, append([]Option{WithTTL(ttl)}, mode.opts...)...)
		require.NoError(t, err)
		armed.Store(true)
		// Should the acquisition hang, resume the server eventually so the
		// test ends and reports it.
		var resumed atomic.Bool
		watchdog := time.AfterFunc(60*time.Second, func() { resumed.Store(true); _ = b.srv.Signal(syscall.SIGCONT) })
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		deadline, _ := ctx.Deadline()
		l, err := mode.call(s, ctx)
		late := time.Since(deadline)
		cancel()
		watchdog.Stop()
		require.NoError(t, b.srv.Signal(syscall.SIGCONT))
		assert.Nil(t, l, mode.name)
		assert.ErrorIs(t, err, context.DeadlineExceeded, mode.name)
		// engine.SettleWait (250ms) after the deadline on a machine with
		// time to spare; a release without a bound held it until the
		// server answered again, which only the watchdog makes it do.
		t.Logf("%s returned %v after its context's deadline", mode.name, late)
		assert.False(t, resumed.Load(), "%s waited for Redis to answer again", mode.name)
		require.Eventually(t, func() bool {
			st, err := plain.Status(context.Background())
			return err == nil && st.Available == 2 && len(st.Holders) == 0
		}, 10*time.Second, 20*time.Millisecond, "%s: the stale grant is given back", mode.name)
		require.True(t, s.pumpsIdleWithin(5*time.Second), mode.name)
	}
	requireInventory(t, plain, 2, 0)
}

// grantModes are the calls that take a grant, each on a semaphore of size 2
// (the weighted ones take both permits), with the options it needs.
var grantModes = []struct {
	name string
	opts []Option
	call func(*Semaphore, context.Context) (*Lease, error)
}{
	{"TryAcquire", nil, (*Semaphore).TryAcquire},
	{"Acquire", []Option{WithWaitConnections(0)}, (*Semaphore).Acquire},
	{"shared Acquire", nil, (*Semaphore).Acquire},
	{"TryAcquireN", nil, func(s *Semaphore, ctx context.Context) (*Lease, error) { return s.TryAcquireN(ctx, 2) }},
	{"AcquireN", nil, func(s *Semaphore, ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, 2) }},
}
