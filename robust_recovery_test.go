package redsem

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// FM-19, FM-02: the reply to the acquire script is lost after Redis ran it.
// The client settles the acquisition by its id: it adopts the lease it was
// granted instead of leaking it or taking a second token.
func TestSemaphore_Acquire_lostReplyIsResolved(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		hp, lose := loseReply(b.pool, engine.Acquire.Script, true)
		s, err := NewSemaphore(hp, "lost-acquire", 2)
		require.NoError(t, err)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		assert.True(t, l.Valid())
		requireInventory(t, s, 1, 1)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 2, 0)

		// TryAcquire whose reply is lost: same outcome.
		lose.Store(true)
		l, err = s.TryAcquire(ctx)
		require.NoError(t, err)
		requireInventory(t, s, 1, 1)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 2, 0)
	})
}

// FM-19: a Release whose reply is lost is retried safely: the token is back
// exactly once, and the caller is told the truth.
func TestLease_Release_lostReplyRetry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		hp, lose := loseReply(b.pool, engine.Release.Script, false)
		s, err := NewSemaphore(hp, "lost-release", 2)
		require.NoError(t, err)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		lose.Store(true)
		// The reply of the first attempt is lost after Redis released; the
		// library retries on a fresh connection, finds the lease gone while
		// its deadline has not passed, and knows its first attempt did it.
		require.NoError(t, l.Release(ctx))
		assert.False(t, lose.Load(), "the first reply was lost")
		require.ErrorIs(t, l.Release(ctx), ErrReleased)
		assert.Equal(t, 2, b.llen(t, s.k.tokens))
		requireInventory(t, s, 2, 0)
	})
}

// FM-01: a waiter whose BLMOVE took a token dies before the lease script
// ran (here: it never sent it). The token sits in its pending list and comes
// back after the wait's block time plus the grace, with no one calling
// Reclaim: the next Acquire sweeps it.
func TestSemaphore_Acquire_strandedPendingTokenReturns(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "stranded", 1, WithGrace(100*time.Millisecond))
		holder, err := s.Acquire(ctx)
		require.NoError(t, err)

		// A raw client goes through the protocol by hand and dies after the move.
		c, err := redis.Dial("tcp", b.addr)
		require.NoError(t, err)
		acq := engine.NewAcqID()
		r, err := parseAcquireReply(engine.Acquire.Do(c, s.acquireCall(acq, 300*time.Millisecond, "fresh").KeysAndArgs...))
		require.NoError(t, err)
		require.Equal(t, int64(0), r.Code)
		require.NoError(t, c.Send("BLMOVE", s.k.tokens, s.k.pend(acq), "LEFT", "RIGHT", "5"))
		require.NoError(t, c.Flush())
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, holder.Release(ctx))
		moved, err := redis.String(c.Receive())
		require.NoError(t, err)
		require.Equal(t, holder.Token(), moved)
		c.Close()

		st, err := s.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, 0, st.Available, "the token is stranded in the pending list")
		start := time.Now()
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		assert.Equal(t, holder.Token(), l.Token())
		t.Logf("back after %v (block + grace, on a machine with time to spare)", time.Since(start)) // else never: Acquire fails with ctx
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// FM-03: a waiter frozen while first in line is handed a token; its lease is
// recorded behind the BLMOVE. The token comes back within the TTL, the next
// waiter gets it, and the frozen waiter, once it runs again, never uses the
// stale grant: it gives it back and waits on.
func TestSemaphore_Acquire_frozenWaiterNeverUsesStaleGrant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const ttl = 300 * time.Millisecond
		s := newSem(t, b, "frozen", 1, WithTTL(ttl))
		holder, err := s.Acquire(ctx)
		require.NoError(t, err)

		var frozen atomic.Bool
		frozen.Store(true)
		hp := &hookPool{Pool: b.pool, BeforeReceive: func(context.Context) {
			if frozen.Swap(false) {
				time.Sleep(3 * ttl)
			}
		}}
		zs, err := NewSemaphore(hp, "frozen", 1, WithTTL(ttl))
		require.NoError(t, err)
		zc := acquireAsync(ctx, zs.Acquire)
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 5*time.Second, 5*time.Millisecond)
		time.Sleep(50 * time.Millisecond)

		// The second waiter's lease must outlive the wait below: a long TTL,
		// not auto-refresh of a 300ms one, which a loaded machine lost.
		s2 := newSem(t, b, "frozen", 1, WithTTL(10*time.Second), WithFixedTTL())
		wc := acquireAsync(ctx, s2.Acquire)
		time.Sleep(50 * time.Millisecond)
		released := time.Now()
		require.NoError(t, holder.Release(ctx)) // Redis hands the token to the frozen waiter

		second, ok := <-wc
		require.True(t, ok)
		t.Logf("the token came back %v after the release (TTL %v)", time.Since(released), ttl)
		// The frozen waiter wakes while the second waiter holds the token:
		// it must not return a lease on it.
		select {
		case l := <-zc:
			t.Fatalf("frozen waiter acquired %s (fence %d, valid %v, deadline in %v) while %s (fence %d) was held", l.Token(), l.Fence(), l.Valid(), time.Until(l.Deadline()), second.Token(), second.Fence())
		case <-time.After(4 * ttl):
		}
		require.NoError(t, second.Release(ctx))
		third, ok := <-zc
		require.True(t, ok, "the frozen waiter acquires once the token is free")
		assert.Greater(t, third.Fence(), second.Fence())
		require.NoError(t, third.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// FM-21: every holder vanishes without releasing while others are blocked
// in Redis. The waiters wake at the earliest lease deadline, reclaim the
// tokens themselves and acquire, with no Reclaim call and no daemon.
func TestSemaphore_Acquire_waitersReclaimAbandonedLeases(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const ttl, size, waiters = 300 * time.Millisecond, 2, 4
		s := newSem(t, b, "abandoned", size, WithTTL(ttl), WithFixedTTL())
		for i := 0; i < size; i++ {
			_, err := s.Acquire(ctx) // abandoned: never released
			require.NoError(t, err)
		}
		start := time.Now()
		got := make(chan *Lease, waiters)
		errs := make(chan error, waiters)
		for i := 0; i < waiters; i++ {
			go func() {
				ws, err := NewSemaphore(newPool(t, b.addr), "abandoned", size, WithTTL(ttl))
				if err == nil {
					var l *Lease
					if l, err = ws.Acquire(ctx); err == nil {
						got <- l
						return
					}
				}
				errs <- err
			}()
		}
		var first []*Lease
		for i := 0; i < size; i++ {
			select {
			case l := <-got:
				first = append(first, l)
			case err := <-errs:
				t.Fatal(err)
			}
		}
		t.Logf("abandoned tokens returned after %v (TTL %v); never, and ctx fails the waiters", time.Since(start), ttl)
		for _, l := range first {
			require.NoError(t, l.Release(ctx))
		}
		for i := 0; i < waiters-size; i++ {
			l := <-got
			require.NoError(t, l.Release(ctx))
		}
		requireInventory(t, s, size, 0)
	})
}

// FM-22: forged, stale and duplicated tokens pushed by a rogue client never
// make an (N+1)-th holder and are dropped when popped.
func TestSemaphore_Acquire_forgedTokensNeverGrantExtra(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		const size = 2
		s := newSem(t, b, "forged", size)
		held, err := s.Acquire(ctx)
		require.NoError(t, err)
		epoch := strings.Split(held.Token(), ":")[0]
		junk := []interface{}{"0", "garbage", "000000000000:1", epoch + ":0", epoch + ":3", epoch + ":01", held.Token(), epoch + ":2"}
		// epoch:2 is the free token: pushing it duplicates a free token.
		b.do(t, "LPUSH", append([]interface{}{s.k.tokens}, junk...)...)
		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, len(junk), st.Stray, "Status reports every stray element")

		var leases []*Lease
		for i := 0; i < len(junk)+2; i++ {
			l, err := s.TryAcquire(ctx)
			if errors.Is(err, ErrNoToken) {
				break
			}
			require.NoError(t, err)
			leases = append(leases, l)
		}
		assert.Len(t, leases, size-1, "only the one free token was granted")
		st, err = s.Status(ctx)
		require.NoError(t, err)
		assert.Len(t, st.Holders, size)
		assert.Equal(t, int64(len(junk)), st.Rejected)
		require.NoError(t, held.Release(ctx))
		for _, l := range leases {
			require.NoError(t, l.Release(ctx))
		}
		requireInventory(t, s, size, 0)
	})
}

// NOSCRIPT: a script cache flushed under a blocked waiter. The waiter's
// pipelined EVALSHA fails and falls back to EVAL with the token still in its
// pending list.
func TestSemaphore_Acquire_scriptFlushWhileBlocked(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "flush", 1)
		holder, err := s.Acquire(ctx)
		require.NoError(t, err)
		ws, err := NewSemaphore(newPool(t, b.addr), "flush", 1)
		require.NoError(t, err)
		got := acquireAsync(ctx, ws.Acquire)
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 5*time.Second, 5*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		b.do(t, "SCRIPT", "FLUSH")
		require.NoError(t, holder.Release(ctx))
		l, ok := <-got
		require.True(t, ok)
		assert.Equal(t, holder.Token(), l.Token())
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// A pool whose read timeout is shorter than one wait: the wait is cut short
// by the read deadline, settled, and retried with shorter blocks; the
// waiter still gets the token and nothing leaks.
func TestSemaphore_Acquire_shortReadTimeoutPool(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	s := newSem(t, b, "short-read", 1)
	holder, err := s.Acquire(ctx)
	require.NoError(t, err)
	short := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", b.addr, redis.DialReadTimeout(1500*time.Millisecond))
	}}
	t.Cleanup(func() { short.Close() })
	ws, err := NewSemaphore(short, "short-read", 1)
	require.NoError(t, err)
	got := acquireAsync(ctx, ws.Acquire)
	// At least one wait cut by the read timeout: the block shrinks to fit.
	require.Eventually(t, func() bool { return time.Duration(ws.maxBlock.Load()) < engine.MaxBlock }, 25*time.Second,
		10*time.Millisecond, "the block shrank to fit the read timeout")
	require.NoError(t, holder.Release(ctx))
	l, ok := <-got
	require.True(t, ok, "the waiter acquired despite the short read timeout")
	require.NoError(t, l.Release(ctx))
	requireInventory(t, s, 1, 0)
}

// CLIENT KILL of a blocked waiter's connection: the wait is settled and
// retried on a fresh connection; the waiter still gets the token.
func TestSemaphore_Acquire_blockedWaiterConnectionKilled(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	s := newSem(t, b, "killed", 1)
	holder, err := s.Acquire(ctx)
	require.NoError(t, err)
	ws, err := NewSemaphore(newPool(t, b.addr), "killed", 1)
	require.NoError(t, err)
	got := acquireAsync(ctx, ws.Acquire)
	for i := 0; i < 3; i++ {
		require.Eventually(t, func() bool {
			list, _ := redis.String(b.do(t, "CLIENT", "LIST"), nil)
			return strings.Contains(list, "cmd=blmove")
		}, 5*time.Second, 5*time.Millisecond)
		b.do(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
	}
	require.NoError(t, holder.Release(ctx))
	l, ok := <-got
	require.True(t, ok)
	assert.Equal(t, engine.MaxBlock, time.Duration(ws.maxBlock.Load()), "a killed connection is not a short read timeout")
	require.NoError(t, l.Release(ctx))
	requireInventory(t, s, 1, 0)
}

// A weighted lease's Release whose reply is lost is retried safely.
func TestLease_Release_weightedLostReplyRetry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		hp, lose := loseReply(b.pool, engine.Release.Script, false)
		s, err := NewSemaphore(hp, "lost-release-n", 3)
		require.NoError(t, err)
		l, err := s.AcquireN(ctx, 3)
		require.NoError(t, err)
		lose.Store(true)
		require.NoError(t, l.Release(ctx))
		assert.False(t, lose.Load())
		require.ErrorIs(t, l.Release(ctx), ErrReleased)
		requireInventory(t, s, 3, 0)
	})
}

// A weighted grant whose reply is lost is resolved by its id: the client
// adopts the lease instead of leaking it.
func TestSemaphore_AcquireN_lostGrantReplyIsResolved(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		hp, _ := loseReply(b.pool, engine.AcquireN.Script, true)
		s, err := NewSemaphore(hp, "lost-grant-n", 3)
		require.NoError(t, err)
		l, err := s.AcquireN(ctx, 2)
		require.NoError(t, err)
		assert.Len(t, l.Tokens(), 2)
		requireInventory(t, s, 1, 2)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 3, 0)
		assert.True(t, errors.Is(l.Err(), ErrReleased))
	})
}

// A weighted waiter blocked while the script cache is flushed: the script
// queued behind its wait answers NOSCRIPT and is run again with EVAL.
func TestSemaphore_AcquireN_scriptFlushWhileBlocked(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "flush-n", 2)
		h1, err := s.Acquire(ctx)
		require.NoError(t, err)
		h2, err := s.Acquire(ctx)
		require.NoError(t, err)
		got := acquireAsync(ctx, func(ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, 2) })
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 5*time.Second, 5*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		b.do(t, "SCRIPT", "FLUSH")
		require.NoError(t, h1.Release(ctx)) // BLMOVE: the first token
		require.Eventually(t, func() bool { return len(collecting(t, s)) == 1 }, 5*time.Second, 5*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		b.do(t, "SCRIPT", "FLUSH")
		require.NoError(t, h2.Release(ctx)) // BLPOP on the bell: the second
		l, ok := <-got
		require.True(t, ok)
		assert.Len(t, l.Tokens(), 2)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 2, 0)
	})
}

// A lapsed lease is reclaimed as soon as its deadline passes, whatever
// leases were granted after it: meta's due stays the earliest deadline
// (a later grant by acquire.lua does not raise it, a sweep sets it to the
// next one), so the next TryAcquire sweeps. miniredis with its clock set.
func TestSemaphore_Acquire_reclaimsEachLapsedLeaseInTime(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	b := &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
	ctx := ctxT(t, 10*time.Second)
	t0 := time.Unix(1700000000, 0)
	m.SetTime(t0)
	short := newSem(t, b, "due", 2, WithTTL(time.Second), WithFixedTTL())
	// Another TTL, and an idle time meta does not have yet: the fast path
	// leaves this acquisition to acquire.lua.
	slow := newSem(t, b, "due", 2, WithTTL(10*time.Second), WithFixedTTL(), WithIdleExpiry(time.Hour))
	long := newSem(t, b, "due", 2, WithTTL(time.Minute), WithFixedTTL())
	x, err := short.TryAcquire(ctx)
	require.NoError(t, err)
	y, err := slow.TryAcquire(ctx)
	require.NoError(t, err)

	m.SetTime(t0.Add(2 * time.Second))
	z, err := long.TryAcquire(ctx)
	require.NoError(t, err, "x lapsed at 1s")
	assert.Equal(t, x.Token(), z.Token())
	m.SetTime(t0.Add(11 * time.Second))
	w, err := long.TryAcquire(ctx)
	require.NoError(t, err, "y lapsed at 10s")
	assert.Equal(t, y.Token(), w.Token())
	for _, l := range []*Lease{z, w} {
		require.NoError(t, l.Release(ctx))
	}
	requireInventory(t, long, 2, 0)
}

// Tokens or leases left without meta (meta evicted or deleted on its own)
// are residue, not a semaphore to create afresh: an acquisition refuses
// them with ErrCorrupt and writes nothing (Repair is for that).
func TestSemaphore_Acquire_residueWithoutMetaIsCorrupt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "residue", 2)
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		b.do(t, "DEL", s.k.meta)
		before := b.snapshot(t)
		_, err = s.TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrCorrupt, "TryAcquire")
		_, err = s.TryAcquireN(ctx, 2)
		assert.ErrorIs(t, err, ErrCorrupt, "TryAcquireN")
		assert.Equal(t, before, b.snapshot(t), "nothing written")
		require.NoError(t, l.Release(ctx))
	})
}

// FM-22 for weighted requests: a stray on the list, or moved into a
// collector's pending list by its BLMOVE (here a copy of a held token), is
// dropped, never collected: no grant includes a token someone else holds.
func TestSemaphore_AcquireN_forgedTokensNeverGrantExtra(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "forged-n", 2)
		x, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		epoch := strings.Split(x.Token(), ":")[0]
		b.do(t, "LPUSH", s.k.tokens, x.Token(), "garbage", epoch+":3")
		_, err = s.TryAcquireN(ctx, 2)
		require.ErrorIs(t, err, ErrNoToken, "one token is free, beside three strays")
		y, err := s.TryAcquire(ctx)
		require.NoError(t, err)

		done := make(chan *Lease, 1)
		errs := make(chan error, 1)
		go func() {
			l, err := s.AcquireN(ctx, 2)
			errs <- err
			done <- l
		}()
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 5*time.Second, time.Millisecond)
		b.do(t, "LPUSH", s.k.tokens, x.Token()) // its BLMOVE takes the copy
		require.NoError(t, y.Release(ctx))
		select {
		case err := <-errs:
			t.Fatalf("AcquireN returned (%v) while %s is held", err, x.Token())
		case <-time.After(300 * time.Millisecond):
		}
		require.NoError(t, x.Refresh(ctx, time.Minute), "x still holds its token")
		require.NoError(t, x.Release(ctx))
		require.NoError(t, <-errs)
		l := <-done
		assert.ElementsMatch(t, []string{x.Token(), y.Token()}, l.Tokens())
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 2, 0)
	})
}
