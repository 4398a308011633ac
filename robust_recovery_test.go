package redsem

import (
	"context"
	"errors"
	"math/rand"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/redsem/redsem/internal/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FM-19, FM-02: the reply to the acquire script is lost after Redis ran it.
// The client settles the acquisition by its id: it adopts the lease it was
// granted instead of leaking it or taking a second token.
func TestLostAcquireReplyIsResolved(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		hp, lose := loseReply(b.pool, engine.Acquire, true)
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
func TestLostReleaseReplyRetry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		hp, lose := loseReply(b.pool, engine.Release, false)
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

// FM-02: the context ends while the BLMOVE is in flight and Redis has
// already handed the waiter a token (and, behind it, recorded the lease).
// The client never reads it; it must give the token back.
func TestCancelAfterTokenServed(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "cancel-served", 1)
		holder, err := s.Acquire(ctx)
		require.NoError(t, err)

		served := make(chan struct{})
		hp := &hookPool{Pool: b.pool, BeforeReceive: func(wctx context.Context) {
			// A waiter too slow to read: it reads only once its ctx is done.
			<-served
			<-wctx.Done()
		}}
		ws, err := NewSemaphore(hp, "cancel-served", 1, WithWaitConnections(0))
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := ws.Acquire(wctx)
			errc <- err
		}()
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 5*time.Second, 5*time.Millisecond, "waiter blocked")
		time.Sleep(50 * time.Millisecond) // let its BLMOVE reach Redis
		require.NoError(t, holder.Release(ctx))
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			return err == nil && len(st.Holders) == 1
		}, 5*time.Second, 5*time.Millisecond, "Redis granted the blocked waiter")
		close(served)
		cancel()
		err = <-errc
		require.ErrorIs(t, err, context.Canceled)
		requireInventory(t, s, 1, 0)
	})
}

// FM-01: a waiter whose BLMOVE took a token dies before the lease script
// ran (here: it never sent it). The token sits in its pending list and comes
// back after the wait's block time plus the grace, with no one calling
// Reclaim: the next Acquire sweeps it.
func TestStrandedPendingTokenReturns(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "stranded", 1, WithGrace(100*time.Millisecond))
		holder, err := s.Acquire(ctx)
		require.NoError(t, err)

		// A raw client goes through the protocol by hand and dies after the move.
		c, err := redis.Dial("tcp", b.addr)
		require.NoError(t, err)
		acq := engine.NewAcqID()
		r, err := parseAcquireReply(engine.Acquire.Do(c, s.acquireArgs(acq, 300*time.Millisecond, "fresh")...))
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
		assert.Less(t, time.Since(start), 2*time.Second, "back within block + grace")
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// FM-03: a waiter frozen while first in line is handed a token; its lease is
// recorded behind the BLMOVE. The token comes back within the TTL, the next
// waiter gets it, and the frozen waiter, once it runs again, never uses the
// stale grant: it gives it back and waits on.
func TestFrozenWaiterNeverUsesStaleGrant(t *testing.T) {
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
		assert.Less(t, time.Since(released), ttl+time.Second, "the token came back within about one TTL")
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
func TestWaitersReclaimAbandonedLeases(t *testing.T) {
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
		assert.Less(t, time.Since(start), ttl+2*time.Second, "abandoned tokens returned within about one TTL")
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
func TestForgedTokensNeverGrantExtra(t *testing.T) {
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
func TestScriptFlushWhileBlocked(t *testing.T) {
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

// FM-20: malformed arguments to a script change nothing.
func TestScriptsRejectBadArgs(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "args", 2)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		before, err := s.Status(ctx)
		require.NoError(t, err)
		c, err := redis.Dial("tcp", b.addr)
		require.NoError(t, err)
		defer c.Close()
		acq := engine.NewAcqID()
		good := []interface{}{2, acq, 1000, "lbl", 0, 100, 100, "fresh"}
		for i, bad := range []interface{}{"x", "short", "-1", "lbl", "-5", "nan", "-1", "later"} {
			args := append([]interface{}{}, good...)
			if i == 3 {
				continue // the label is free text
			}
			args[i] = bad
			_, err := engine.Acquire.Do(c, append(append(s.k.all(5), s.k.pend(acq)), args...)...)
			assert.Error(t, err, "argument %d = %v", i, bad)
		}
		_, err = engine.Refresh.Do(c, append(s.k.all(4), l.Token(), l.acqID, "soon")...)
		assert.Error(t, err)
		_, err = engine.Abort.Do(c, append(append(s.k.all(5), s.k.pend(acq)), acq, "explode", 10)...)
		assert.Error(t, err)
		_, err = engine.Reclaim.Do(c, append(s.k.all(5), 0)...)
		assert.Error(t, err)
		after, err := s.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, before.Available, after.Available)
		assert.Equal(t, before.Holders, after.Holders)
		assert.Equal(t, before.Rejected, after.Rejected)
		require.NoError(t, l.Release(ctx))
	})
}

// FM-17: leases are timed by Redis TIME alone. A client whose view of time
// is an hour off from the server's still gets a local deadline one TTL
// ahead on its own clock, and expiry follows the server's clock.
func TestServerClockDecidesExpiry(t *testing.T) {
	b := &backend{name: "miniredis"}
	eachBackend := func(f func()) { f() }
	eachBackend(func() {
		m := miniredisT(t)
		b.mini, b.addr, b.pool = m, m.Addr(), newPool(t, m.Addr())
	})
	ctx := ctxT(t, 10*time.Second)
	skew := time.Hour
	b.mini.SetTime(time.Now().Add(skew))
	s := newSem(t, b, "skew", 1, WithTTL(10*time.Second))
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(10*time.Second), l.Deadline(), time.Second, "local deadline is one TTL on the local clock")
	st, err := s.Status(ctx)
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(skew+10*time.Second), st.Holders[0].Deadline, time.Second, "server deadline is on the server clock")
	// The server's clock passes the deadline: the lease is reclaimed by the
	// next client even though no client clock moved.
	b.mini.SetTime(time.Now().Add(skew + 11*time.Second))
	n, err := s.Reclaim(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.ErrorIs(t, l.Refresh(ctx, time.Second), ErrLeaseLost)
}

// Concurrency invariant (the hammer): goroutines, each on its own
// connection, hammer a size-K semaphore. At every instant at most K hold,
// the limit is reached, no token is held twice, each token's fences
// increase, and afterwards exactly K tokens are free. It runs for dur, then
// on until the limit was reached (20s at most), so that a slow machine does
// not fail the guard that shows the check could fail.
func TestHammerInvariants(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const size, workers = 3, 12
		dur := 1500 * time.Millisecond
		ctx := ctxT(t, 30*time.Second)
		var (
			mu        sync.Mutex
			holding   = map[string]bool{}
			lastFence = map[string]int64{}
			fences    = map[int64]bool{}
			cur, max  int
			holds     int
			problems  []string
		)
		deadline, hardStop := time.Now().Add(dur), time.Now().Add(20*time.Second)
		going := func() bool {
			if time.Now().Before(deadline) {
				return true
			}
			mu.Lock()
			defer mu.Unlock()
			return max < size && time.Now().Before(hardStop)
		}
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				s, err := NewSemaphore(newPool(t, b.addr), "hammer", size)
				if err != nil {
					errs <- err
					return
				}
				for going() {
					l, err := s.Acquire(ctx)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					cur++
					holds++
					if cur > max {
						max = cur
					}
					if holding[l.Token()] {
						problems = append(problems, "token held twice: "+l.Token())
					}
					if l.Fence() <= lastFence[l.Token()] || fences[l.Fence()] {
						problems = append(problems, "fence did not increase for "+l.Token())
					}
					holding[l.Token()], lastFence[l.Token()], fences[l.Fence()] = true, l.Fence(), true
					mu.Unlock()
					time.Sleep(time.Duration(rng.Intn(2000)) * time.Microsecond)
					mu.Lock()
					cur--
					holding[l.Token()] = false
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			}(int64(w))
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		t.Logf("%s: %d holds by %d workers, max concurrent %d of %d", b.name, holds, workers, max, size)
		assert.Empty(t, problems)
		assert.Equal(t, size, max, "the limit was reached, so the check could fail")
		assert.Greater(t, holds, workers)
		s := newSem(t, b, "hammer", size)
		requireInventory(t, s, size, 0)
	})
}

// FM-02 at volume: thousands of Acquire calls with tiny random deadlines
// against a busy semaphore. Afterwards exactly K tokens remain. One call in
// ten is a TryAcquire, which takes a free token however loaded the machine:
// with only 1-30ms deadlines a race build beside a CPU hog timed every call
// out, so the semaphore was never even contended. (Long Acquires instead
// left dozens of BLMOVEs blocked in miniredis, which wakes every one of them
// at each write, and slowed its storm threefold.)
//
// "Afterwards" is the documented bound (docs/failure-modes.md, FM-02): what
// a cancelled Acquire was handed comes back by its settlement, which keeps
// trying for engine.SettleTimeout, or failing that by lease expiry, one TTL. On an
// overloaded server a settlement can time out, and so can a Release (it did,
// past its own 5s, on miniredis in a race build beside two CPU hogs): its
// outcome is then unknown and the lease expires after its TTL (lease.go). The
// wait allows for that, and logs where the tokens were when they were not
// back after a few seconds.
func TestCancellationStorm(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const size, callers, calls = 2, 40, 50
		ctx := ctxT(t, 120*time.Second)
		var timeouts, grants, unknown atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for c := 0; c < callers; c++ {
			wg.Add(1)
			go func(seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				s, err := NewSemaphore(newPool(t, b.addr), "storm", size, WithGrace(200*time.Millisecond))
				if err != nil {
					errs <- err
					return
				}
				for i := 0; i < calls; i++ {
					var l *Lease
					if i%10 == 9 {
						l, err = s.TryAcquire(ctx)
						if errors.Is(err, ErrNoToken) {
							continue
						}
					} else {
						cctx, cancel := context.WithTimeout(ctx, time.Duration(1+rng.Intn(30))*time.Millisecond)
						l, err = s.Acquire(cctx)
						cancel()
					}
					switch {
					case err == nil:
						grants.Add(1)
						time.Sleep(time.Duration(rng.Intn(3)) * time.Millisecond)
						err := l.Release(ctx)
						var ne net.Error
						if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
							// The outcome is unknown; calling again is safe
							// and returns nil or ErrLeaseLost, or fails the
							// same way (the lease then expires).
							unknown.Add(1)
							err = l.Release(ctx)
							if errors.Is(err, ErrLeaseLost) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
								err = nil
							}
						}
						if err != nil {
							errs <- err
							return
						}
					case errors.Is(err, context.DeadlineExceeded):
						timeouts.Add(1)
					default:
						errs <- err
						return
					}
				}
			}(int64(c))
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		t.Logf("%s: %d calls, %d grants, %d timed out, %d releases of unknown outcome", b.name, callers*calls, grants.Load(), timeouts.Load(), unknown.Load())
		assert.Positive(t, timeouts.Load(), "the storm cancelled waits")
		assert.Positive(t, grants.Load())
		s := newSem(t, b, "storm", size)
		whole := func() bool {
			_, _ = s.Reclaim(ctx)
			st, err := s.Status(ctx)
			return err == nil && st.Available == size && len(st.Holders) == 0
		}
		began := time.Now()
		bound := engine.SettleTimeout + s.cfg.ttl + 5*time.Second
		logged := false
		// Whole, and still whole half a second later: miniredis keeps a
		// closed client's blocked BLMOVE until its (short) timeout, so a
		// late move can take a token just after a first look; it comes back
		// by the settle or the sweep, within the bound.
		stable := func() bool {
			if !whole() {
				return false
			}
			time.Sleep(500 * time.Millisecond)
			return whole()
		}
		for !stable() && time.Since(began) < bound {
			if !logged && time.Since(began) > 5*time.Second {
				logged = true
				inv, err := s.Check(ctx)
				waits, _ := redis.Strings(b.do(t, "ZRANGE", s.k.waits, 0, -1, "WITHSCORES"), nil)
				holders, _ := redis.StringMap(b.do(t, "HGETALL", s.k.holders), nil)
				t.Logf("%s: not whole after 5s: inventory %+v %v; waits %v; holders %v", b.name, inv, err, waits, holders)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%s: whole again %v after the storm", b.name, time.Since(began).Round(time.Millisecond))
		requireInventory(t, s, size, 0)
	})
}

// A pool whose read timeout is shorter than one wait: the wait is cut short
// by the read deadline, settled, and retried with shorter blocks; the
// waiter still gets the token and nothing leaks.
func TestShortReadTimeoutPool(t *testing.T) {
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
	time.Sleep(2500 * time.Millisecond) // at least one wait cut by the read timeout
	require.NoError(t, holder.Release(ctx))
	l, ok := <-got
	require.True(t, ok, "the waiter acquired despite the short read timeout")
	assert.Less(t, time.Duration(ws.maxBlock.Load()), engine.MaxBlock, "the block shrank to fit the read timeout")
	require.NoError(t, l.Release(ctx))
	requireInventory(t, s, 1, 0)
}

// CLIENT KILL of a blocked waiter's connection: the wait is settled and
// retried on a fresh connection; the waiter still gets the token.
func TestBlockedWaiterConnectionKilled(t *testing.T) {
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
