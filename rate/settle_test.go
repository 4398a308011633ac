package rate

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// A Wait whose context ends while Redis does not answer returns within
// engine.SettleWait of that end, the bound a cancelled Acquire keeps (it
// used to wait for its abort script up to 5 s), and once Redis answers
// again the abort has run: nobody is left queued.
func TestRateGateCancelledWaitDoesNotOutliveContext(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	b := &backend{name: "redis", addr: srv.Addr}
	b.pool = &redis.Pool{MaxIdle: 8, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", b.addr)
	}}
	t.Cleanup(func() { b.pool.Close() })
	ctx := ctxT(t, 30*time.Second)
	g := newGate(t, b, "hung", 1, time.Minute)
	_, err := g.Allow(ctx) // the only start: the Wait below queues
	require.NoError(t, err)

	// Should the Wait hang, resume the server eventually so the test ends.
	var resumed atomic.Bool
	watchdog := time.AfterFunc(60*time.Second, func() { resumed.Store(true); _ = srv.Signal(syscall.SIGCONT) })
	defer watchdog.Stop()
	stop := time.AfterFunc(150*time.Millisecond, func() { _ = srv.Signal(syscall.SIGSTOP) })
	defer stop.Stop()
	wctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	defer cancel()
	deadline, _ := wctx.Deadline()
	_, err = g.Wait(wctx)
	late := time.Since(deadline)
	require.NoError(t, srv.Signal(syscall.SIGCONT))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	t.Logf("Wait returned %v after its context's deadline (engine.SettleWait %v)", late, engine.SettleWait)
	assert.False(t, resumed.Load(), "Wait waited for Redis to answer again")

	require.Eventually(t, func() bool {
		st, err := g.Status(ctx)
		return err == nil && st.Waiting == 0
	}, 10*time.Second, 20*time.Millisecond, "the cancelled Wait left the queue once Redis answered")
	assert.Equal(t, 0, b.num(t, "LLEN", g.q.k.base+"queue"), "nobody left in the queue")
}

// A start given back (its waiter's context ended after Redis granted it)
// can bring the queue head's turn closer: the head waited for that start to
// leave the window. rate_abort.lua rings the head so that it times its
// wake-up again; it used not to, and the head slept on, up to a window late,
// while Allow refused everyone behind it. (Found by the protocol explorer,
// "random rate seed 11832".)
func TestRateGate_givenBackStartRetimesTheHead(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "retime", 2, time.Minute)
		_, err := g.AllowN(ctx, 2) // the window is full
		require.NoError(t, err)
		conn := b.pool.Get()
		defer conn.Close()
		register := func(acq string, units int) engine.Reply {
			r, err := parseRateReply(engine.RunScript(ctx, conn, g.q.takeCall(acq, time.Minute.Microseconds(), "fresh", []int{units})))
			require.NoError(t, err)
			require.Equal(t, int64(engine.CodeWaiting), r.Code)
			return r
		}
		a, h := engine.NewAcqID(), engine.NewAcqID()
		register(a, 1)
		require.NoError(t, g.SetRate(ctx, 3, time.Minute)) // serves a, which never learns of it
		// h needs the whole window: its turn is when a's start leaves it.
		r := register(h, 3)
		require.True(t, r.Head)
		require.Equal(t, 0, b.num(t, "LLEN", g.q.k.inbox(h)))

		p := &takeUnits{q: g.q, units: []int{1}}
		r, err = p.Abort(ctx, a, "release")
		require.NoError(t, err)
		require.Equal(t, int64(engine.CodeReleased), r.Code)
		assert.Equal(t, 1, b.num(t, "LLEN", g.q.k.inbox(h)), "the head was rung: its turn is the first start's end now")
	})
}
