package redsem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/failpoint"
)

func newElection(t testing.TB, p Pool, name string, opts ...Option) *Election {
	t.Helper()
	e, err := NewElection(p, name, opts...)
	require.NoError(t, err)
	return e
}

// observed collects what an Observe reports, for the test goroutine.
type observed struct {
	mu  sync.Mutex
	got []Leader
	err chan error
}

// observe runs e.Observe until the test ends.
func observe(t *testing.T, e *Election) *observed {
	o := &observed{err: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		o.err <- e.Observe(ctx, func(l Leader) {
			o.mu.Lock()
			o.got = append(o.got, l)
			o.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		err := <-o.err
		assert.ErrorIs(t, err, context.Canceled)
	})
	return o
}

func (o *observed) list() []Leader {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Leader(nil), o.got...)
}

// waitFor waits until the observer has reported n changes.
func (o *observed) waitFor(t *testing.T, n int) []Leader {
	t.Helper()
	require.Eventually(t, func() bool { return len(o.list()) >= n }, 20*time.Second, time.Millisecond,
		"observed %v, want %d changes", o.list(), n)
	return o.list()
}

// waiting counts the campaigners registered as waiting in Redis.
func waiting(t testing.TB, b *backend, e *Election) int {
	ms, err := redis.Strings(b.do(t, "ZRANGE", e.s.k.waits, 0, -1), nil)
	require.NoError(t, err)
	n := 0
	for _, m := range ms {
		if strings.HasPrefix(m, "w:") {
			n++
		}
	}
	return n
}

func none() Leader { return Leader{} }

func leader(l *Leadership, value string) Leader { return Leader{Term: l.Term(), Value: value} }

// A campaign leads, proclaims and resigns; the next leads with a greater
// term, and Leader reads each state.
func TestElection_campaignProclaimResign(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		e := newElection(t, b.pool, "job")
		got, err := e.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, none(), got)
		assert.Zero(t, b.keyCount(t), "reading the leader of an unused election writes nothing")

		var last int64
		for _, v := range []string{"a", "b", "c"} {
			l, err := e.Campaign(ctx, v)
			require.NoError(t, err)
			require.Greater(t, l.Term(), last, "terms rise")
			require.True(t, l.Valid())
			last = l.Term()
			got, err := e.Leader(ctx)
			require.NoError(t, err)
			assert.Equal(t, leader(l, v), got)

			require.NoError(t, l.Proclaim(ctx, v+"'"))
			got, err = e.Leader(ctx)
			require.NoError(t, err)
			assert.Equal(t, leader(l, v+"'"), got, "proclaim keeps the term")

			require.NoError(t, l.Resign(ctx))
			assert.ErrorIs(t, context.Cause(l.Context()), ErrReleased)
			assert.False(t, l.Valid())
			got, err = e.Leader(ctx)
			require.NoError(t, err)
			assert.Equal(t, none(), got)
			assert.ErrorIs(t, l.Resign(ctx), ErrReleased)
			assert.ErrorIs(t, l.Proclaim(ctx, "late"), ErrReleased)
		}
	})
}

// Campaigners lead in the order they campaigned. On a real Redis only:
// miniredis serves none of several clients blocked on one list (a
// Semaphore's waiters on connections of their own fare the same there).
func TestElection_firstComeFirstServed(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	{
		ctx := ctxT(t, 60*time.Second)
		names := []string{"second", "third", "fourth"}
		first, err := newElection(t, b.pool, "fifo").Campaign(ctx, "first")
		require.NoError(t, err)
		var won []chan *Leadership
		for i, v := range names {
			// One Election per campaigner, as in separate processes.
			e := newElection(t, b.pool, "fifo", WithWaitConnections(0))
			ch := make(chan *Leadership, 1)
			go func() {
				l, err := e.Campaign(ctx, v)
				if err != nil {
					t.Logf("%s: %v", v, err)
					close(ch)
					return
				}
				ch <- l
			}()
			won = append(won, ch)
			// Registered and blocked: a first call registers in one round
			// trip and blocks in the next, so the next campaigner starts
			// once Redis holds this one's BLMOVE in its queue.
			require.Eventually(t, func() bool { return waiting(t, b, e) == i+1 && blockedClients(t, b) == i+1 },
				10*time.Second, time.Millisecond)
		}
		cur := first
		for i, v := range names {
			require.NoError(t, cur.Resign(ctx))
			cur = <-won[i]
			require.NotNil(t, cur, v)
			got, err := newElection(t, b.pool, "fifo").Leader(ctx)
			require.NoError(t, err)
			assert.Equal(t, v, got.Value)
		}
		require.NoError(t, cur.Resign(ctx))
	}
}

// An observer reports the current leader, then every change in order, each
// once, even the ones made while it was busy in f.
func TestElection_observeEveryChange(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		e := newElection(t, b.pool, "watched")
		busy := make(chan struct{})
		var mu sync.Mutex
		var got []Leader
		octx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- e.Observe(octx, func(l Leader) {
				mu.Lock()
				got = append(got, l)
				n := len(got)
				mu.Unlock()
				if n == 2 {
					<-busy // changes pile up meanwhile
				}
			})
		}()
		list := func() []Leader { mu.Lock(); defer mu.Unlock(); return append([]Leader(nil), got...) }
		require.Eventually(t, func() bool { return len(list()) == 1 }, 10*time.Second, time.Millisecond)

		a, err := e.Campaign(ctx, "a")
		require.NoError(t, err)
		require.Eventually(t, func() bool { return len(list()) == 2 }, 10*time.Second, time.Millisecond)
		require.NoError(t, a.Proclaim(ctx, "a2"))
		require.NoError(t, a.Resign(ctx))
		c, err := e.Campaign(ctx, "c")
		require.NoError(t, err)
		close(busy)
		want := []Leader{none(), leader(a, "a"), leader(a, "a2"), none(), leader(c, "c")}
		require.Eventually(t, func() bool { return len(list()) >= len(want) }, 10*time.Second, time.Millisecond)
		require.NoError(t, c.Resign(ctx))
		want = append(want, none())
		require.Eventually(t, func() bool { return len(list()) >= len(want) }, 10*time.Second, time.Millisecond)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		assert.Equal(t, want, list())
		// Observe waits SettleWait for its leave, which goes on in the
		// background if that is not enough (a loaded machine).
		require.Eventually(t, func() bool { return b.zcard(t, e.s.k.base+"observers") == 0 }, 10*time.Second, 10*time.Millisecond,
			"the observer took its registration back")
	})
}

// A Campaign whose context ends leaves nothing behind: ended before it
// starts, or while it waits (the etcd bug #21128 kept such a campaign's key
// and blocked every later campaigner): once the holder resigns, no lease,
// holder record or queue entry of the campaign is left, only its tombstone.
func TestElection_campaignContextEnds(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		e := newElection(t, b.pool, "ctx")
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_, err := e.Campaign(ended, "early")
		require.ErrorIs(t, err, context.Canceled)
		assert.Zero(t, b.keyCount(t))

		holder, err := e.Campaign(ctx, "holder")
		require.NoError(t, err)
		other := newElection(t, b.pool, "ctx", WithWaitConnections(0))
		wctx, wcancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { _, err := other.Campaign(wctx, "waiter"); errc <- err }()
		require.Eventually(t, func() bool { return waiting(t, b, e) == 1 }, 10*time.Second, time.Millisecond)
		wcancel()
		require.ErrorIs(t, <-errc, context.Canceled)
		assert.Zero(t, waiting(t, b, e), "the waiter is gone from Redis")
		require.NoError(t, holder.Resign(ctx))
		// No lease, holder record or queue entry of the campaign is left:
		// only its tombstone in waits, which expires. (A BLMOVE the server
		// had not yet dropped with the waiter's connection may have moved
		// the resigned token into the campaign's pending list; the
		// tombstone's sweep gives it back, by design.)
		keys := nameKeys(t, b, e.s.k.base)
		assert.NotContains(t, keys, e.s.k.base+"holders", "no holder record is left: %v", keys)
		assert.NotContains(t, keys, e.s.k.base+"leases", "no lease is left: %v", keys)
		ws, err := redis.Strings(b.do(t, "ZRANGE", e.s.k.waits, 0, -1), nil)
		require.NoError(t, err)
		require.Len(t, ws, 1)
		assert.True(t, strings.HasPrefix(ws[0], "x:"), "waits holds the tombstone only: %v", ws)
	})
}

// nameKeys lists the keys under base (one name's).
func nameKeys(t testing.TB, b *backend, base string) []string {
	all, err := redis.Strings(b.do(t, "KEYS", "*"), nil)
	require.NoError(t, err)
	var out []string
	for _, k := range all {
		if strings.HasPrefix(k, base) {
			out = append(out, k)
		}
	}
	return out
}

// A Campaign granted as its context ends gives the seat back. Alone: the
// failpoint is the process's.
func TestElection_campaignContextEndsAtGrant(t *testing.T) {
	if !alone(t) {
		return
	}
	for _, b := range []*backend{{name: "miniredis", mini: miniredisT(t)}, realRedis(t)} {
		if b.mini != nil {
			b.addr = b.mini.Addr()
			b.pool = newPool(t, b.addr)
		}
		ctx := ctxT(t, 20*time.Second)
		e := newElection(t, b.pool, "grant")
		gctx, gcancel := context.WithCancel(ctx)
		failpoint.Set(func(p string) bool {
			if p == "acquire.granted" {
				gcancel()
			}
			return false
		})
		_, err := e.Campaign(gctx, "granted")
		failpoint.Set(nil)
		require.ErrorIs(t, err, context.Canceled, b.name)
		got, err := e.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, none(), got, b.name)
		l, err := e.s.TryAcquire(ctx)
		require.NoError(t, err, "%s: the seat is free", b.name)
		require.NoError(t, l.Release(ctx))
	}
}

// The options that cannot apply are refused, and so is a value too long.
func TestElection_refusedArguments(t *testing.T) {
	t.Parallel()
	m := miniredisT(t)
	p := newPool(t, m.Addr())
	for _, o := range []Option{WithFixedTTL(), WithAdoptSize(), WithIdleExpiry(time.Second)} {
		_, err := NewElection(p, "x", o)
		assert.ErrorIs(t, err, ErrInvalidOption)
	}
	_, err := NewElection(p, "", WithTTL(time.Second))
	assert.ErrorIs(t, err, ErrInvalidName)
	e := newElection(t, p, "x")
	_, err = e.Campaign(context.Background(), strings.Repeat("v", maxElectionValue+1))
	require.Error(t, err)
	l, err := e.Campaign(context.Background(), strings.Repeat("v", maxElectionValue))
	require.NoError(t, err)
	require.Error(t, l.Proclaim(context.Background(), strings.Repeat("v", maxElectionValue+1)))
	require.NoError(t, l.Resign(context.Background()))
	var nl *Leadership
	assert.ErrorIs(t, nl.Resign(context.Background()), ErrLeaseLost)
	assert.True(t, errors.Is(context.Cause(nl.Context()), ErrLeaseLost))
	assert.Zero(t, nl.Term())
	assert.False(t, nl.Valid())
}

// An observer that falls more than the log's 100 changes behind is given
// the current leader next, once, and goes on from there.
func TestElection_observeFarBehind(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		e := newElection(t, b.pool, "behind")
		busy := make(chan struct{})
		var mu sync.Mutex
		var got []Leader
		octx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- e.Observe(octx, func(l Leader) {
				mu.Lock()
				got = append(got, l)
				n := len(got)
				mu.Unlock()
				if n == 1 {
					<-busy
				}
			})
		}()
		list := func() []Leader { mu.Lock(); defer mu.Unlock(); return append([]Leader(nil), got...) }
		require.Eventually(t, func() bool { return len(list()) == 1 }, 10*time.Second, time.Millisecond)
		a, err := e.Campaign(ctx, "v0")
		require.NoError(t, err)
		for i := 1; i <= 150; i++ {
			require.NoError(t, a.Proclaim(ctx, fmt.Sprint("v", i)))
		}
		close(busy)
		require.Eventually(t, func() bool { return len(list()) == 2 }, 10*time.Second, time.Millisecond)
		require.NoError(t, a.Resign(ctx))
		require.Eventually(t, func() bool { return len(list()) == 3 }, 10*time.Second, time.Millisecond)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		assert.Equal(t, []Leader{none(), leader(a, "v150"), none()}, list())
		assert.EqualValues(t, 100, b.llen(t, e.s.k.base+"log"), "the log keeps the last 100 changes")
	})
}

// A leader's Resign wakes a campaigner of the same process (the same
// Election, behind its pump) at once: it leads while the resigned
// leadership's TTL of an hour has barely begun, with a greater term.
func TestElection_resignWakesACampaignerOfTheSameProcess(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		e := newElection(t, b.pool, "local", WithTTL(time.Hour))
		first, err := e.Campaign(ctx, "a")
		require.NoError(t, err)
		won := make(chan *Leadership, 1)
		go func() {
			l, err := e.Campaign(ctx, "b")
			assert.NoError(t, err)
			won <- l
		}()
		require.Eventually(t, func() bool { return waiting(t, b, e) == 1 }, 10*time.Second, time.Millisecond,
			"the second campaign waits in Redis")
		require.NoError(t, first.Resign(ctx))
		var next *Leadership
		select {
		case next = <-won:
		case <-time.After(20 * time.Second):
			t.Fatal("the campaigner of the same process was not woken by the resign (its TTL is an hour)")
		}
		require.NotNil(t, next)
		assert.Greater(t, next.Term(), first.Term())
		got, err := e.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, leader(next, "b"), got)
		require.NoError(t, next.Resign(ctx))
	})
}
