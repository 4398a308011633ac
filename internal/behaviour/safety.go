package behaviour

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

// testShrinkWhileWaiting: a shrink while waiters are blocked in Redis and
// more than the new size hold grants nothing until the holders fall below
// the new size, and at every grant Redis records at most the new size of
// holders.
func testShrinkWhileWaiting(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	const size, newSize, waiters = 3, 1, 2
	s := e.sem(t, size)
	var held []*redsem.Lease
	for i := 0; i < size; i++ {
		l, err := s.Acquire(c)
		require.NoError(t, err)
		held = append(held, l)
	}
	type grant struct {
		i       int
		l       *redsem.Lease
		holders int // as Status saw them just after the grant
		err     error
	}
	granted := make(chan grant, waiters)
	for i := 0; i < waiters; i++ {
		w := e.sem(t, size, redsem.WithAdoptSize(), redsem.WithWaitConnections(0))
		go func() {
			l, err := w.Acquire(c)
			g := grant{i: i, l: l, err: err, holders: -1}
			if err == nil {
				if st, serr := e.adm().Status(c); serr == nil {
					g.holders = len(st.Holders)
				} else {
					g.err = serr
				}
			}
			granted <- g
		}()
		WaitFor(t, 10*time.Second, "waiter registered", func() bool { return e.waiting(t) >= i+1 })
	}
	require.NoError(t, e.adm().Resize(c, newSize))
	noGrant := func(what string) {
		t.Helper()
		select {
		case g := <-granted:
			t.Fatalf("waiter %d granted %s (err %v)", g.i, what, g.err)
		case <-time.After(150 * time.Millisecond):
		}
	}
	for i := 0; i < size; i++ {
		noGrant("while the old holders exceed the new size")
		st, err := e.adm().Status(c)
		require.NoError(t, err)
		assert.Equal(t, newSize, st.Size)
		assert.Len(t, st.Holders, size-i)
		require.NoError(t, held[i].Release(c))
	}
	for n := 0; n < waiters; n++ {
		var g grant
		select {
		case g = <-granted:
		case <-c.Done():
			t.Fatalf("waiter not served after the shrink drained")
		}
		require.NoError(t, g.err)
		assert.LessOrEqual(t, g.holders, newSize, "holders at the grant of waiter %d", g.i)
		if n+1 < waiters {
			noGrant("while the new size is held")
		}
		require.NoError(t, g.l.Release(c))
	}
	e.requireWhole(t, newSize, 0)
}

// testReleaseEndedContext: Release with a context already cancelled, or
// past its deadline, still frees the slot (it runs under a context of its
// own), and a blocked waiter gets it.
func testReleaseEndedContext(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 1, redsem.WithTTL(time.Minute), redsem.WithFixedTTL())
	cancelled, cancel := context.WithCancel(c)
	cancel()
	expired, cancel2 := context.WithDeadline(c, time.Now().Add(-time.Second))
	defer cancel2()
	for _, ended := range []context.Context{cancelled, expired} {
		l, err := s.Acquire(c)
		require.NoError(t, err)
		require.NoError(t, l.Release(ended))
		assert.False(t, l.Valid())
		e.requireWhole(t, 1, 0)
	}
	// With a waiter blocked, the freed slot goes to it.
	l, err := s.Acquire(c)
	require.NoError(t, err)
	w := e.sem(t, 1, redsem.WithTTL(time.Minute), redsem.WithFixedTTL(), redsem.WithWaitConnections(0))
	got := make(chan error, 1)
	var next *redsem.Lease
	go func() {
		var err error
		next, err = w.Acquire(c)
		got <- err
	}()
	WaitFor(t, 10*time.Second, "waiter registered", func() bool { return e.waiting(t) >= 1 })
	require.NoError(t, l.Release(cancelled))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-c.Done():
		t.Fatal("waiter not served after a Release with an ended context")
	}
	require.NoError(t, next.Release(c))
	e.requireWhole(t, 1, 0)
}

// testDroppedLeaseExpires: a lease with a fixed TTL that its holder drops
// (a crashed process) expires, and a waiter of another client gets its
// token, not before the TTL (about one TTL after on a machine with time to
// spare; never, and the test's context fails it).
func testDroppedLeaseExpires(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	const ttl = 500 * time.Millisecond
	s := e.sem(t, 1, redsem.WithTTL(ttl), redsem.WithFixedTTL())
	start := time.Now()
	dropped, err := s.Acquire(c)
	require.NoError(t, err)
	// Dropped: never refreshed, never released.
	other := e.sem(t, 1, redsem.WithTTL(time.Minute), redsem.WithFixedTTL(), redsem.WithWaitConnections(0))
	next, err := other.Acquire(c)
	require.NoError(t, err)
	took := time.Since(start)
	t.Logf("dropped lease's token granted %v after its grant (TTL %v)", took, ttl)
	assert.GreaterOrEqual(t, took, ttl-50*time.Millisecond, "granted before the TTL")
	assert.Greater(t, next.Fence(), dropped.Fence())
	assert.False(t, dropped.Valid())
	require.ErrorIs(t, dropped.Release(c), redsem.ErrLeaseLost)
	st, err := e.adm().Status(c)
	require.NoError(t, err)
	require.Len(t, st.Holders, 1)
	assert.Equal(t, next.Token(), st.Holders[0].Token)
	require.NoError(t, next.Release(c))
	e.requireWhole(t, 1, 0)
}
