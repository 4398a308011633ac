package redsem

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gomodule/redigo/redis"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/failpoint"
)

// A Refresh to a shorter TTL lowers the semaphore's earliest deadline: if
// the holder then dies, its token is reclaimed by the next acquirer once the
// shorter TTL has passed, not when the old one would have (issue 11, bug 4).
func TestLease_Refresh_shorterTTLIsReclaimedInTime(t *testing.T) {
	t.Parallel()
	// The old TTL is far past every ceiling below, the shorter one long
	// enough that a loaded machine's round trip does not outlast it (a
	// Refresh to 200ms came back expired).
	const oldTTL, shorter, within = 5 * time.Minute, 2 * time.Second, 30 * time.Second
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, k := range []int{1, 2} {
			ctx := ctxT(t, 3*time.Minute)
			name := "shorter-" + string(rune('0'+k))
			s := newSem(t, b, name, k, WithTTL(oldTTL), WithFixedTTL())
			l, err := s.AcquireN(ctx, k)
			require.NoError(t, err)
			require.NoError(t, l.Refresh(ctx, shorter))
			// The holder dies here: nobody releases or refreshes l again.
			time.Sleep(shorter + 100*time.Millisecond)

			other := newSem(t, b, name, k)
			var got *Lease
			for end := time.Now().Add(within); got == nil && time.Now().Before(end); {
				if got, err = other.TryAcquireN(ctx, k); err != nil {
					require.ErrorIs(t, err, ErrNoToken)
					time.Sleep(50 * time.Millisecond)
				}
			}
			require.NotNil(t, got, "k=%d: the expired lease was not reclaimed within %v of its %v TTL", k, within, shorter)
			require.NoError(t, got.Release(ctx))

			// An Acquire that must wait is woken by the shorter deadline too.
			l, err = s.AcquireN(ctx, k)
			require.NoError(t, err)
			require.NoError(t, l.Refresh(ctx, shorter))
			actx, cancel := context.WithTimeout(ctx, within)
			got, err = other.AcquireN(actx, k)
			cancel()
			require.NoError(t, err, "k=%d", k)
			require.NoError(t, got.Release(ctx))
		}
	})
}

// A Refresh(300ms) that starts and ends while an older Refresh(10s) has
// read its reply but not applied it: the older reply must not raise the
// local deadline over the one Redis now enforces. (The failpoint holds the
// gap open; the hook is process-wide, so the backends run one after the
// other.)
func TestLease_Refresh_inTheGapOfAnother(t *testing.T) {
	if !alone(t) {
		return
	}
	for _, name := range []string{"miniredis", "redis"} {
		t.Run(name, func(t *testing.T) {
			var b *backend
			if name == "miniredis" {
				m := miniredis.RunT(t)
				b = &backend{name: name, mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
			} else {
				b = realRedis(t)
			}
			ctx := ctxT(t, 20*time.Second)
			s := newSem(t, b, "refresh-gap", 1, WithTTL(10*time.Second), WithFixedTTL())
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			var once atomic.Bool
			inner := make(chan error, 1)
			failpoint.Set(func(p string) bool {
				if p == "refresh.replied" && once.CompareAndSwap(false, true) {
					inner <- l.Refresh(ctx, 300*time.Millisecond)
				}
				return false
			})
			defer failpoint.Set(nil)
			require.NoError(t, l.Refresh(ctx, 10*time.Second))
			require.NoError(t, <-inner)
			failpoint.Set(nil)

			st, err := s.Status(ctx)
			require.NoError(t, err)
			require.Len(t, st.Holders, 1)
			serverLeft := st.Holders[0].Deadline.Sub(st.ServerTime)
			require.Less(t, serverLeft, time.Second, "Redis ran the 300ms refresh last")
			assert.LessOrEqual(t, time.Until(l.Deadline()), serverLeft,
				"local deadline %v away, Redis's %v", time.Until(l.Deadline()), serverLeft)
			time.Sleep(serverLeft + 50*time.Millisecond)
			assert.False(t, l.Valid(), "Valid() after Redis let the lease expire")
		})
	}
}

// A waiter already blocked when the holder refreshes to a shorter TTL
// wakes by the old deadline at the latest (its block was fitted to it; no
// command can shorten a BLMOVE already waiting), then reclaims the token:
// the bound the README gives for this case. Judged in Redis's own
// figures, not by a clock of this machine: the waiter's registration (its
// block's end plus the grace) falls by the old server deadline plus the
// grace, and the waiter then gets the token.
func TestLease_Refresh_shorterTTLWithAWaiterBlocked(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 2*time.Minute)
	// Long enough that the holder, refreshing once the waiter blocks, is
	// still live on a loaded machine (3s was not); the waiter waits it out.
	const oldTTL = 10 * time.Second
	s := newSem(t, b, "shorter-blocked", 1, WithTTL(oldTTL), WithFixedTTL())
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	oldDeadline, err := redis.Int64(b.do(t, "ZSCORE", s.k.leases, l.Token()), nil)
	require.NoError(t, err)
	other := newSem(t, b, "shorter-blocked", 1)
	got := make(chan error, 1)
	go func() {
		g, err := other.Acquire(ctx)
		if err == nil {
			err = g.Release(ctx)
		}
		got <- err
	}()
	var sweep int64
	require.Eventually(t, func() bool {
		w, err := redis.Int64Map(b.do(t, "ZRANGE", s.k.waits, 0, -1, "WITHSCORES"), nil)
		for m, score := range w {
			if strings.HasPrefix(m, "w:") {
				sweep = score
			}
		}
		return err == nil && sweep > 0
	}, 30*time.Second, 10*time.Millisecond, "the waiter registers")
	assert.LessOrEqual(t, sweep, oldDeadline+1+DefaultGrace.Milliseconds(),
		"the waiter's block ends after the holder's deadline")
	time.Sleep(100 * time.Millisecond) // and blocks
	require.NoError(t, l.Refresh(ctx, 200*time.Millisecond))
	// The holder dies here: nobody releases or refreshes l again.
	require.NoError(t, <-got)
}

// FM-09 on the server: refresh.lua refuses a lease whose server deadline has
// passed even when the client still believes in it.
func TestLease_Refresh_neverResurrects(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "resurrect", 1, WithTTL(time.Minute))
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		// Move the server deadline into the past behind the client's back.
		b.do(t, "ZADD", s.k.leases, "XX", 1, l.Token())
		require.ErrorIs(t, l.Refresh(ctx, time.Minute), ErrLeaseLost)
		assert.ErrorIs(t, l.Err(), ErrLeaseLost)
		assert.False(t, l.Valid())
		// It was not reclaimed yet, so no one else holds it: nothing leaks.
		n, err := s.Reclaim(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		requireInventory(t, s, 1, 0)
	})
}

func refreshExtendsLease(t *testing.T) { // run by TestLease_Refresh_inTime
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		// Refreshed every 600ms on a 2s TTL: a loaded machine's late
		// wake-up has 1.4s before the lease would end (at 100ms on 200ms,
		// it had 100ms, and lost it).
		const ttl = 2 * time.Second
		s := newSem(t, b, "refresh", 1, WithTTL(ttl), WithFixedTTL())
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		for i := 0; i < 4; i++ {
			time.Sleep(600 * time.Millisecond)
			require.NoError(t, l.Refresh(ctx, ttl))
		}
		assert.True(t, l.Valid(), "held for 2.4s on a 2s TTL by refreshing")
		require.ErrorIs(t, l.Refresh(ctx, 0), ErrInvalidTTL)
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		require.NoError(t, l.Release(ctx))
	})
}

// A live holder keeps its lease by default (auto-refresh), as with
// Redisson's watchdog and etcd's sessions; WithFixedTTL makes the lease end
// after its TTL unless refreshed by hand, and a later WithAutoRefresh
// undoes it.
func refreshAutoHoldsUntilRelease(t *testing.T) { // run by TestLease_Refresh_inTime
	eachBackend(t, func(t *testing.T, b *backend) {
		// Auto-refresh runs a third of the TTL in: at 2s, a loaded
		// machine's late refresh still comes before the end (at 300ms it
		// came after). The cases run side by side, on names of their own.
		const ttl = 2 * time.Second
		for i, c := range []struct {
			name  string
			opts  []Option
			fixed bool
		}{
			{"default", nil, false},
			{"WithAutoRefresh", []Option{WithAutoRefresh()}, false},
			{"WithFixedTTL", []Option{WithFixedTTL()}, true},
			{"WithFixedTTL then WithAutoRefresh", []Option{WithFixedTTL(), WithAutoRefresh()}, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				ctx := ctxT(t, time.Minute)
				s := newSem(t, b, "auto-"+strconv.Itoa(i), 1, append([]Option{WithTTL(ttl)}, c.opts...)...)
				l, err := s.Acquire(ctx)
				require.NoError(t, err, c.name)
				time.Sleep(4 * ttl)
				if c.fixed {
					assert.False(t, l.Valid(), "%s: the fixed lease ended after its TTL", c.name)
					assert.ErrorIs(t, l.Err(), ErrLeaseExpired, c.name)
					l2, err := s.TryAcquire(ctx) // reclaims the expired lease
					require.NoError(t, err, c.name)
					require.NoError(t, l2.Release(ctx), c.name)
					require.ErrorIs(t, l.Release(ctx), ErrLeaseLost, c.name)
				} else {
					assert.True(t, l.Valid(), "%s: auto-refresh kept the lease past four TTLs (%v)", c.name, l.Err())
					_, err = s.TryAcquire(ctx)
					require.ErrorIs(t, err, ErrNoToken, c.name)
					require.NoError(t, l.Release(ctx), c.name)
				}
				requireInventory(t, s, 1, 0)
			})
		}
		// goleak in TestMain proves the refreshers stopped.
	})
}

// Auto-refresh is a timer per lease, not a goroutine: a process holding
// many leases (a large semaphore, AcquireN's callers) runs no goroutine for
// each until a refresh is due.
func TestLease_Refresh_autoCostsNoGoroutinePerLease(t *testing.T) {
	if !alone(t) { // it counts the process's goroutines
		return
	}
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const n = 300
		s := newSem(t, b, "many", n) // a 30s TTL: no refresh falls due here
		var leases []*Lease
		for range n {
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			leases = append(leases, l)
		}
		// Alone, but the other backend's subtest runs beside this one:
		// count only goroutines in a Lease's methods, wherever their lease
		// is.
		assert.Less(t, goroutinesIn("redsem.(*Lease)"), n/10, "goroutines in a Lease's methods while %d leases are held", n)
		for _, l := range leases {
			require.NoError(t, l.Release(ctx))
		}
		requireInventory(t, s, n, 0)
	})
}

// goroutinesIn counts the goroutines whose stack mentions fn.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<24)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// TestLease_Refresh_inTime runs the tests that judge a refresh made in
// time: alone, in a process of their own (beside the package's parallel
// tests in one process, their CPU delayed such a refresh past even a TTL of
// seconds), and all at once, since they mostly sleep.
func TestLease_Refresh_inTime(t *testing.T) {
	if !alone(t) {
		return
	}
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"extendsLease", refreshExtendsLease},
		{"autoHoldsUntilRelease", refreshAutoHoldsUntilRelease},
		{"weighted", refreshWeighted},
		{"rwLeaseContract", rwLeaseContract},
		{"observerSeesFailedAutoRefresh", observerSeesFailedAutoRefresh},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.f(t)
		})
	}
}
