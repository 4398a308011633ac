package redsem

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/rate"
)

// Each package takes only its own options: a semaphore's option given to
// rate.New (redsem.WithTTL has no meaning for a rate gate), or a rate
// gate's to NewSemaphore, does not compile, since neither option type can
// implement the other's unexported method. The table lists every option of
// both packages.
func TestSemaphore_Options_typedPerPackage(t *testing.T) {
	pool := &redis.Pool{}
	semOption := reflect.TypeOf((*Option)(nil)).Elem()
	rateOption := reflect.TypeOf((*rate.Option)(nil)).Elem()
	for name, o := range map[string]Option{
		"WithPrefix": WithPrefix("p:"), "WithTTL": WithTTL(time.Second), "WithGrace": WithGrace(0),
		"WithLabel": WithLabel("l"), "WithFixedTTL": WithFixedTTL(), "WithAutoRefresh": WithAutoRefresh(),
		"WithBlockingPool": WithBlockingPool(pool), "WithAdoptSize": WithAdoptSize(),
		"WithWaitConnections": WithWaitConnections(1), "WithObserver": WithObserver(&admin.Counters{}),
	} {
		assert.True(t, reflect.TypeOf(o).Implements(semOption), name)
		assert.False(t, reflect.TypeOf(o).Implements(rateOption), "redsem.%s is a rate.Option", name)
	}
	for name, o := range map[string]rate.Option{
		"WithPrefix": rate.WithPrefix("p:"), "WithGrace": rate.WithGrace(0),
		"WithBlockingPool": rate.WithBlockingPool(pool), "WithObserver": rate.WithObserver(&admin.Counters{}),
	} {
		assert.True(t, reflect.TypeOf(o).Implements(rateOption), name)
		assert.False(t, reflect.TypeOf(o).Implements(semOption), "rate.%s is a redsem.Option", name)
	}
}

func TestSemaphore_New_rejectsBadInput(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		cases := []struct {
			name string
			pool Pool
			sem  string
			size int
			opts []Option
			want error
		}{
			{"nil pool", nil, "a", 1, nil, ErrInvalidOption},
			{"typed nil pool", (*redis.Pool)(nil), "a", 1, nil, ErrInvalidOption},
			{"empty name", b.pool, "", 1, nil, ErrInvalidName},
			{"huge name", b.pool, strings.Repeat("x", 1<<20), 1, nil, ErrInvalidName},
			{"size 0", b.pool, "a", 0, nil, ErrInvalidSize},
			{"negative size", b.pool, "a", -3, nil, ErrInvalidSize},
			{"size above max", b.pool, "a", MaxSize + 1, nil, ErrInvalidSize},
			{"ttl 0", b.pool, "a", 1, []Option{WithTTL(0)}, ErrInvalidTTL},
			{"negative ttl", b.pool, "a", 1, []Option{WithTTL(-time.Second)}, ErrInvalidTTL},
			{"ttl above max", b.pool, "a", 1, []Option{WithTTL(MaxTTL + 1)}, ErrInvalidTTL},
			{"brace in prefix", b.pool, "a", 1, []Option{WithPrefix("x{")}, ErrInvalidOption},
			{"negative grace", b.pool, "a", 1, []Option{WithGrace(-1)}, ErrInvalidOption},
			{"huge label", b.pool, "a", 1, []Option{WithLabel(strings.Repeat("l", maxLabelLen+1))}, ErrInvalidOption},
			{"nil option", b.pool, "a", 1, []Option{nil}, ErrInvalidOption},
			{"nil blocking pool", b.pool, "a", 1, []Option{WithBlockingPool(nil)}, ErrInvalidOption},
		}
		for _, c := range cases {
			s, err := NewSemaphore(c.pool, c.sem, c.size, c.opts...)
			assert.ErrorIs(t, err, c.want, c.name)
			assert.Nil(t, s, c.name)
			_, err = NewMutex(c.pool, c.sem, c.opts...)
			if c.want != ErrInvalidSize {
				assert.ErrorIs(t, err, c.want, "mutex: "+c.name)
			}
		}
		assert.Equal(t, 0, b.keyCount(t), "nothing may be written for bad input")
	})
}

// A TTL no grant could be used under (the local safety margin, 1% + 2ms, is
// most or all of it) is refused by every constructor and by Refresh, before
// any I/O: with 1-2ms every grant was already invalid on arrival and
// TryAcquire spun on Redis for ever.
func TestSemaphore_WithTTL_tooShortIsRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		for _, ttl := range []time.Duration{time.Millisecond, 2 * time.Millisecond, MinTTL - time.Microsecond} {
			_, err := NewSemaphore(b.pool, "short", 1, WithTTL(ttl))
			assert.ErrorIs(t, err, ErrInvalidTTL, "semaphore, ttl %v", ttl)
			_, err = NewMutex(b.pool, "short", WithTTL(ttl))
			assert.ErrorIs(t, err, ErrInvalidTTL, "mutex, ttl %v", ttl)
		}
		assert.Equal(t, 0, b.keyCount(t), "nothing may be written for bad input")

		s := newSem(t, b, "short", 1, WithTTL(MinTTL))
		assert.Equal(t, MinTTL, s.TTL())
		s = newSem(t, b, "short", 1)
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, l.Refresh(ctx, 2*time.Millisecond), ErrInvalidTTL)
		require.ErrorIs(t, l.Refresh(ctx, MinTTL-time.Microsecond), ErrInvalidTTL)
		assert.True(t, l.Valid(), "a refused Refresh leaves the lease alone")
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// FM-20: malformed arguments to a script change nothing.
func TestSemaphore_Scripts_rejectBadArgs(t *testing.T) {
	t.Parallel()
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

// FM-20: malformed arguments to the weighted scripts change nothing.
func TestSemaphore_Scripts_weightedRejectBadArgs(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "args-n", 3)
		l, err := s.AcquireN(ctx, 2)
		require.NoError(t, err)
		before, err := s.Status(ctx)
		require.NoError(t, err)
		c, err := redis.Dial("tcp", b.addr)
		require.NoError(t, err)
		defer c.Close()
		acq := engine.NewAcqID()
		good := s.acquireNArgs(acq, 2, 100, "fresh")
		nk := len(good) - 12
		for i, bad := range []interface{}{"x", "short", 0, "-1", nil, "nan", "-5", "inf", 0, "later", nil, "-3"} {
			if bad == nil {
				continue // the label and the size mode are free text
			}
			args := append([]interface{}{}, good...)
			args[nk+i] = bad
			_, err := engine.AcquireN.Do(c, args...)
			assert.Error(t, err, "argument %d = %v", i, bad)
		}
		args := append([]interface{}{}, good...)
		args[nk+9] = "wait"
		args[nk+5] = 0
		_, err = engine.AcquireN.Do(c, args...)
		assert.Error(t, err, "a wait phase never tries only")
		_, err = engine.AbortN.Do(c, append(good[:nk:nk], acq, 2, "explode", 10)...)
		assert.Error(t, err)
		_, err = engine.AbortN.Do(c, append(good[:nk:nk], acq, 0, "release", 10)...)
		assert.Error(t, err)
		_, err = engine.Refresh.Do(c, append(s.k.all(4), l.Token(), l.acqID, "soon", l.Tokens()[1])...)
		assert.Error(t, err)
		after, err := s.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, before.Available, after.Available)
		assert.ElementsMatch(t, before.Holders, after.Holders) // one fence: any order
		assert.Equal(t, before.Rejected, after.Rejected)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 3, 0)
	})
}

// Each script's argument checks stop at their bounds: the bound itself is
// taken and the value just past it refused (REDSEM_ARG), in the fast paths
// as in the scripts behind them.
func TestSemaphore_Scripts_argumentBounds(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		c, err := redis.Dial("tcp", b.addr)
		require.NoError(t, err)
		defer c.Close()
		s := newSem(t, b, "bounds", 3)
		big := newSem(t, b, "bounds-big", 3)
		rw, err := NewRWMutex(b.pool, "bounds-rw")
		require.NoError(t, err)
		k := s.k
		one := func(acq string) []interface{} { return append(k.all(5), k.pend(acq)) }
		many := func(acq string) []interface{} { return append(k.all(5), k.pend(acq), k.bell(acq), k.wqueue()) }
		rwk := func(acq string) []interface{} { return append(rw.s.k.rw(), rw.s.k.bell(acq)) }
		type script struct {
			run  *engine.Script
			keys func(acq string) []interface{}
			args func(acq string) []interface{} // all in bounds
		}
		var (
			acquire = script{engine.Acquire, one, func(acq string) []interface{} {
				return []interface{}{3, acq, 1000, "", 0, 100, 100, "fresh", "fixed", 0}
			}}
			acquireN = script{engine.AcquireN, many, func(acq string) []interface{} {
				return []interface{}{3, acq, 1, 1000, "", 0, 100, 100, 10, "fresh", "fixed", 0}
			}}
			abort   = script{engine.Abort, one, func(acq string) []interface{} { return []interface{}{acq, "release", 100} }}
			abortN  = script{engine.AbortN, many, func(acq string) []interface{} { return []interface{}{acq, 1, "release", 100} }}
			reclaim = script{engine.Reclaim, func(string) []interface{} { return k.all(5) }, func(string) []interface{} { return []interface{}{10} }}
			refresh = script{engine.Refresh, func(string) []interface{} { return k.all(4) }, func(acq string) []interface{} {
				return []interface{}{"x:1", acq, 1000}
			}}
			resize = script{engine.Resize, func(string) []interface{} { return big.k.all(5) }, func(acq string) []interface{} {
				return []interface{}{3, acq, 0}
			}}
			rwAcquire = script{engine.RWAcquire, rwk, func(acq string) []interface{} {
				return []interface{}{acq, "r", 1000, "", 0, 100, "fresh"}
			}}
			rwAbort   = script{engine.RWAbort, rwk, func(acq string) []interface{} { return []interface{}{acq, "release", 100, 1000} }}
			rwRefresh = script{engine.RWRefresh, func(string) []interface{} { return rw.s.k.rw() }, func(acq string) []interface{} {
				return []interface{}{"x:r", acq, 1000}
			}}
		)
		for _, tc := range []struct {
			name      string
			s         script
			arg       int
			ok, wrong interface{}
		}{
			{"acquire size", acquire, 0, 1, 0}, {"acquire size", acquire, 0, 100000, 100001},
			{"acquire ttlMs", acquire, 2, 1, 0},
			{"acquire blockMs", acquire, 4, 0, -1}, {"acquire blockMs", acquire, 4, "1000000000", "10000000000"},
			{"acquire graceMs", acquire, 5, 0, -1}, {"acquire graceMs", acquire, 5, "1000000000", "10000000000"},
			{"acquire tombMs", acquire, 6, 0, -1}, {"acquire tombMs", acquire, 6, "1000000000", "10000000000"},
			{"acquire idleMs", acquire, 9, 0, -1},
			{"acquire_n size", acquireN, 0, 1, 0}, {"acquire_n size", acquireN, 0, 100000, 100001},
			{"acquire_n acqID", acquireN, 1, "0123456789abcdef", "0123456789abcde"},
			{"acquire_n k", acquireN, 2, 1, 0}, {"acquire_n k", acquireN, 2, 100000, 100001},
			{"acquire_n ttlMs", acquireN, 3, 1, 0},
			{"acquire_n blockMs", acquireN, 5, 0, -1},
			{"acquire_n graceMs", acquireN, 6, 0, -1},
			{"acquire_n tombMs", acquireN, 7, 0, -1},
			{"acquire_n pollMs", acquireN, 8, 1, 0},
			{"acquire_n idleMs", acquireN, 11, 0, -1},
			{"abort tombMs", abort, 2, 0, -1},
			{"abort_n k", abortN, 1, 1, 0}, {"abort_n k", abortN, 1, 100000, 100001},
			{"abort_n tombMs", abortN, 3, 0, -1},
			{"reclaim limit", reclaim, 0, 1, 0}, {"reclaim limit", reclaim, 0, 100000, 100001},
			{"refresh ttlMs", refresh, 2, 1, 0},
			{"resize n", resize, 0, 1, 0}, {"resize n", resize, 0, 100000, 100001},
			{"resize idleMs", resize, 2, 0, -1},
			{"rw_acquire ttlMs", rwAcquire, 2, 1, 0},
			{"rw_acquire blockMs", rwAcquire, 4, 0, -1},
			{"rw_acquire graceMs", rwAcquire, 5, 0, -1},
			{"rw_abort tombMs", rwAbort, 2, 0, -1},
			{"rw_abort ttlMs", rwAbort, 3, 1, 0},
			{"rw_refresh ttlMs", rwRefresh, 2, 1, 0},
		} {
			for _, v := range []interface{}{tc.ok, tc.wrong} {
				acq := engine.NewAcqID()
				if tc.name == "acquire_n acqID" {
					acq = v.(string)
				}
				args := tc.s.args(acq)
				args[tc.arg] = v
				_, err := tc.s.run.Do(c, append(tc.s.keys(acq), args...)...)
				if v == tc.ok && err != nil {
					assert.NotContains(t, err.Error(), "REDSEM_ARG", "%s = %v is in bounds", tc.name, v)
				} else if v == tc.wrong && assert.Error(t, err, "%s = %v", tc.name, v) {
					assert.Contains(t, err.Error(), "REDSEM_ARG", "%s = %v", tc.name, v)
				}
			}
		}
	})
}
