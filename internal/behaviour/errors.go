package behaviour

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/rate"
)

// testWrongType: each key of the semaphore's layout (docs/redis.md)
// overwritten with a string gives ErrWrongType, the foreign value is left
// alone, and once the key is restored nothing is lost: the inventory is
// whole and the holder still holds. Every operation either fails with
// ErrWrongType or does its job without that key.
func testWrongType(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	// strict: the parts every acquisition, Status and Release read.
	strict := map[string]bool{"tokens": true, "leases": true, "holders": true, "meta": true}
	for _, part := range []string{"tokens", "leases", "holders", "meta", "waits"} {
		e.name = "bt-WrongType-" + part + "-" + randHex()
		s := e.sem(t, 2, redsem.WithTTL(time.Minute), redsem.WithFixedTTL())
		held, err := s.Acquire(c)
		require.NoError(t, err)
		other, err := s.Acquire(c)
		require.NoError(t, err)
		// A wait that times out, so that waits has had an entry; then one
		// token held, one free.
		wctx, cancel := context.WithTimeout(c, 100*time.Millisecond)
		_, err = s.Acquire(wctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, part)
		require.NoError(t, other.Release(c))

		key, saved := e.key(part), e.key("saved-"+part)
		existed, err := redis.Int(e.do(t, "EXISTS", key), nil)
		require.NoError(t, err)
		if strict[part] {
			require.Equal(t, 1, existed, "%s exists before the overwrite", part)
		}
		if existed == 1 {
			e.do(t, "RENAME", key, saved)
		}
		e.do(t, "SET", key, "not yours")

		var wrong int
		check := func(what string, err error) bool {
			t.Helper()
			if strict[part] {
				assert.ErrorIs(t, err, redsem.ErrWrongType, "%s: %s", part, what)
			} else if err != nil {
				assert.ErrorIs(t, err, redsem.ErrWrongType, "%s: %s", part, what)
			}
			if errors.Is(err, redsem.ErrWrongType) {
				wrong++
			}
			return err == nil
		}
		var got []*redsem.Lease
		l, err := s.TryAcquire(c)
		if check("TryAcquire", err) {
			got = append(got, l)
		}
		// Bounded: had TryAcquire taken the free token, it would wait.
		wctx, cancel = context.WithTimeout(c, 2*time.Second)
		l, err = s.Acquire(wctx)
		cancel()
		if len(got) == 0 || !errors.Is(err, context.DeadlineExceeded) {
			if check("Acquire", err) {
				got = append(got, l)
			}
		}
		_, err = e.adm().Status(c)
		check("Status", err)
		_, err = e.adm().Check(c)
		check("Check", err)
		released := false
		// A release reads neither waits nor, on its fast path, meta
		// (internal/engine/lua/release_fast.lua): it may go through.
		if err := held.Release(c); part != "waits" && part != "meta" {
			check("Release", err)
		} else {
			released = err == nil
		}
		assert.Greater(t, wrong, 0, "%s: no operation saw the wrong type", part)
		v, err := redis.String(e.do(t, "GET", key), nil)
		require.NoError(t, err)
		assert.Equal(t, "not yours", v, part)

		// Restored, nothing is lost: the holder still holds (unless its
		// release went through) and its token comes back on release.
		e.do(t, "DEL", key)
		if existed == 1 {
			e.do(t, "RENAME", saved, key)
		}
		if !released {
			assert.True(t, held.Valid(), part)
			e.requireWhole(t, 2-len(got)-1, 1+len(got))
			require.NoError(t, held.Release(c), part)
		}
		for _, l := range got {
			require.NoError(t, l.Release(c), part)
		}
		e.requireWhole(t, 2, 0)
		l, err = s.TryAcquire(c)
		require.NoError(t, err, part)
		require.NoError(t, l.Release(c), part)
	}
}

// testSizeMismatch: a client asking for another size than the stored one
// gets a *SizeMismatchError and changes nothing.
func testSizeMismatch(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s2 := e.sem(t, 2)
	l, err := s2.Acquire(c)
	require.NoError(t, err)
	_, err = e.sem(t, 3).Acquire(c)
	require.ErrorIs(t, err, redsem.ErrSizeMismatch)
	var me *redsem.SizeMismatchError
	require.True(t, errors.As(err, &me), "%T %v", err, err)
	assert.Equal(t, 2, me.Stored)
	assert.Equal(t, 3, me.Want)
	_, err = e.sem(t, 3).TryAcquireN(c, 1)
	require.ErrorIs(t, err, redsem.ErrSizeMismatch)
	require.NoError(t, l.Release(c))
	e.requireWhole(t, 2, 0)
}

// testNoScript: with the script cache flushed before each call, every
// operation falls back from EVALSHA to EVAL.
func testNoScript(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 2)
	e.flushScripts(t)
	l, err := s.TryAcquire(c)
	require.NoError(t, err)
	e.flushScripts(t)
	require.NoError(t, l.Refresh(c, time.Minute))
	e.flushScripts(t)
	require.NoError(t, l.Release(c))
	e.flushScripts(t)
	_, err = e.adm().Status(c)
	require.NoError(t, err)
	e.flushScripts(t)
	g, err := rate.New(e.tg.Pool, e.name, 5, time.Second)
	require.NoError(t, err)
	_, err = g.Allow(c)
	require.NoError(t, err)
	e.requireWhole(t, 2, 0)
}

// testNoScriptWhileWaiting: the lease script pipelined behind a blocked
// waiter's BLMOVE meets an empty script cache, and the waiter still gets
// its lease.
func testNoScriptWhileWaiting(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	s := e.sem(t, 1)
	held, err := s.Acquire(c)
	require.NoError(t, err)
	w := e.sem(t, 1, redsem.WithWaitConnections(0))
	type grant struct {
		l   *redsem.Lease
		err error
	}
	got := make(chan grant, 1)
	go func() {
		l, err := w.Acquire(c)
		got <- grant{l, err}
	}()
	WaitFor(t, 10*time.Second, "waiter registered", func() bool { return e.waiting(t) >= 1 })
	e.flushScripts(t)
	require.NoError(t, held.Release(c))
	var g grant
	select {
	case g = <-got:
	case <-c.Done():
		t.Fatal("waiter not served")
	}
	require.NoError(t, g.err)
	assert.True(t, g.l.Valid())
	e.requireWhole(t, 0, 1)
	require.NoError(t, g.l.Release(c))
	e.requireWhole(t, 1, 0)
}
