package redsem

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/redsem/redsem/internal/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewSemaphoreRejectsBadInput(t *testing.T) {
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

func TestAcquireReleaseBasics(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "basics", 3, WithLabel("test-holder"))
		var leases []*Lease
		var last int64
		for i := 0; i < 3; i++ {
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			assert.Greater(t, l.Fence(), last, "fences strictly increase")
			last = l.Fence()
			assert.True(t, l.Valid())
			assert.NoError(t, l.Err())
			assert.WithinDuration(t, time.Now().Add(DefaultTTL), l.Deadline(), 2*time.Second)
			leases = append(leases, l)
		}
		_, err := s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)

		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.True(t, st.Exists)
		assert.Equal(t, 3, st.Size)
		assert.Equal(t, 0, st.Available)
		require.Len(t, st.Holders, 3)
		slots := map[string]bool{}
		for i, h := range st.Holders {
			assert.Equal(t, leases[i].Token(), h.Token)
			assert.Equal(t, leases[i].Fence(), h.Fence)
			assert.Equal(t, "test-holder", h.Label)
			assert.False(t, h.Expired)
			slots[h.Token] = true
		}
		assert.Len(t, slots, 3, "three distinct tokens")

		require.NoError(t, leases[1].Release(ctx))
		assert.ErrorIs(t, leases[1].Err(), ErrReleased)
		assert.False(t, leases[1].Valid())
		select {
		case <-leases[1].Done():
		default:
			t.Fatal("Done not closed after Release")
		}
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		assert.Equal(t, leases[1].Token(), l.Token(), "the freed token is handed out again")
		assert.Greater(t, l.Fence(), last)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, leases[0].Release(ctx))
		require.NoError(t, leases[2].Release(ctx))
		requireInventory(t, s, 3, 0)
	})
}

// FM-06: double release must never add a token.
func TestDoubleReleaseAddsNoToken(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "double", 2)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		require.ErrorIs(t, l.Release(ctx), ErrReleased)
		require.ErrorIs(t, l.Refresh(ctx, time.Second), ErrReleased)

		// Concurrently, from two goroutines: exactly one succeeds.
		l, err = s.Acquire(ctx)
		require.NoError(t, err)
		errs := make(chan error, 2)
		for i := 0; i < 2; i++ {
			go func() { errs <- l.Release(ctx) }()
		}
		e1, e2 := <-errs, <-errs
		assert.True(t, (e1 == nil) != (e2 == nil), "exactly one release succeeds: %v, %v", e1, e2)
		assert.Equal(t, 2, b.llen(t, s.k.tokens))
		requireInventory(t, s, 2, 0)

		var nilLease *Lease
		assert.ErrorIs(t, nilLease.Release(ctx), ErrLeaseLost)
		assert.ErrorIs(t, nilLease.Refresh(ctx, time.Second), ErrLeaseLost)
		assert.False(t, nilLease.Valid())
	})
}

// FM-07, FM-08, FM-09: a holder that stalls past its lease loses it. Its
// token is reclaimed and handed on; its late Release and Refresh fail with
// ErrLeaseLost and push nothing.
func TestStalledHolderLosesLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "stall", 1, WithTTL(150*time.Millisecond), WithFixedTTL())
		stale, err := s.Acquire(ctx)
		require.NoError(t, err)
		time.Sleep(200 * time.Millisecond)
		assert.False(t, stale.Valid(), "Valid reads the clock: false past the deadline")
		<-stale.Done()
		assert.ErrorIs(t, stale.Err(), ErrLeaseExpired)
		assert.ErrorIs(t, stale.Refresh(ctx, time.Second), ErrLeaseExpired, "FM-09: no refresh after expiry")

		// The next holder's lease is long: with 150ms a loaded machine let
		// it expire too before the TryAcquire below, which then got it.
		long := newSem(t, b, "stall", 1, WithTTL(10*time.Second), WithFixedTTL())
		next, err := long.Acquire(ctx) // reclaims the expired lease on the way
		require.NoError(t, err)
		assert.Equal(t, stale.Token(), next.Token())
		assert.Greater(t, next.Fence(), stale.Fence())

		require.ErrorIs(t, stale.Release(ctx), ErrLeaseLost, "FM-07: release after reclaim")
		assert.Equal(t, 0, b.llen(t, s.k.tokens), "no second copy of the token")
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		require.NoError(t, next.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// FM-09 on the server: refresh.lua refuses a lease whose server deadline has
// passed even when the client still believes in it.
func TestRefreshNeverResurrects(t *testing.T) {
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

func TestRefreshExtendsLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "refresh", 1, WithTTL(200*time.Millisecond), WithFixedTTL())
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		for i := 0; i < 4; i++ {
			time.Sleep(100 * time.Millisecond)
			require.NoError(t, l.Refresh(ctx, 200*time.Millisecond))
		}
		assert.True(t, l.Valid(), "held for 400ms on a 200ms TTL by refreshing")
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
func TestAutoRefreshHoldsUntilRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		const ttl = 300 * time.Millisecond
		for _, c := range []struct {
			name  string
			opts  []Option
			fixed bool
		}{
			{"default", nil, false},
			{"WithAutoRefresh", []Option{WithAutoRefresh()}, false},
			{"WithFixedTTL", []Option{WithFixedTTL()}, true},
			{"WithFixedTTL then WithAutoRefresh", []Option{WithFixedTTL(), WithAutoRefresh()}, false},
		} {
			s := newSem(t, b, "auto", 1, append([]Option{WithTTL(ttl)}, c.opts...)...)
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
		}
		// goleak in TestMain proves the refreshers stopped.
	})
}

// FM-10: the first client creates the semaphore; a client with another size
// gets a clear error and changes nothing.
func TestSizeMismatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s5 := newSem(t, b, "sized", 5)
		l, err := s5.Acquire(ctx)
		require.NoError(t, err)
		s3 := newSem(t, b, "sized", 3)
		_, err = s3.Acquire(ctx)
		require.ErrorIs(t, err, ErrSizeMismatch)
		var sm *SizeMismatchError
		require.True(t, errors.As(err, &sm))
		assert.Equal(t, 5, sm.Stored)
		assert.Equal(t, 3, sm.Want)
		_, err = s3.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrSizeMismatch)
		mu, err := NewMutex(b.pool, "sized")
		require.NoError(t, err)
		_, err = mu.TryLock(ctx)
		require.ErrorIs(t, err, ErrSizeMismatch)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s5, 5, 0)
	})
}

// FM-10: many clients racing to create the semaphore make exactly one.
func TestCreationRace(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const racers, size = 40, 7
		type res struct {
			l   *Lease
			err error
		}
		out := make(chan res, racers)
		for i := 0; i < racers; i++ {
			go func() {
				s, err := NewSemaphore(b.pool, "race", size)
				if err != nil {
					out <- res{nil, err}
					return
				}
				l, err := s.TryAcquire(ctx)
				out <- res{l, err}
			}()
		}
		var got []*Lease
		for i := 0; i < racers; i++ {
			r := <-out
			if r.err != nil {
				require.ErrorIs(t, r.err, ErrNoToken)
				continue
			}
			got = append(got, r.l)
		}
		require.Len(t, got, size, "exactly size grants among the racers")
		epoch := strings.Split(got[0].Token(), ":")[0]
		for _, l := range got {
			assert.Equal(t, epoch, strings.Split(l.Token(), ":")[0], "one epoch")
			require.NoError(t, l.Release(ctx))
		}
		s := newSem(t, b, "race", size)
		requireInventory(t, s, size, 0)
	})
}

// Bad input: a semaphore key overwritten with another type surfaces as
// ErrWrongType from every operation, with nothing written or lost.
func TestWrongTypeKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "typed", 2)
		held, err := s.Acquire(ctx)
		require.NoError(t, err)
		for _, key := range []string{s.k.tokens, s.k.leases, s.k.holders, s.k.meta, s.k.waits} {
			existed, err := redis.Bool(b.do(t, "EXISTS", key), nil)
			require.NoError(t, err)
			if existed {
				b.do(t, "RENAME", key, "saved")
			}
			b.do(t, "SET", key, "not yours")
			l, err := s.TryAcquire(ctx)
			if key == s.k.waits {
				// The fast path does not use waits until a sweep is due;
				// hold the free token so that Acquire has to wait.
				require.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrWrongType, key)
			}
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = s.Acquire(wctx)
			cancel()
			assert.ErrorIs(t, err, ErrWrongType, key)
			if l != nil {
				require.NoError(t, l.Release(ctx))
			}
			_, err = s.Status(ctx)
			assert.ErrorIs(t, err, ErrWrongType, key)
			_, err = s.Reclaim(ctx)
			assert.ErrorIs(t, err, ErrWrongType, key)
			if key == s.k.leases || key == s.k.holders {
				assert.ErrorIs(t, held.Refresh(ctx, time.Minute), ErrWrongType, key)
			}
			if key != s.k.waits && key != s.k.meta {
				assert.ErrorIs(t, held.Release(ctx), ErrWrongType, key)
			}
			v, err := redis.String(b.do(t, "GET", key), nil)
			require.NoError(t, err)
			assert.Equal(t, "not yours", v, "the foreign value is untouched")
			b.do(t, "DEL", key)
			if existed {
				b.do(t, "RENAME", "saved", key)
			}
		}
		require.NoError(t, held.Release(ctx))
		requireInventory(t, s, 2, 0)
	})
}

// Odd names are encoded so that all keys of one semaphore share one hash tag
// and two different names never share keys.
func TestOddNames(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		names := []string{"}", "{", "{a}", "a}b", "x y", "new\nline", "\xff\xfe", "%7D", "ключ", "a:b", strings.Repeat("n", engine.MaxNameLen)}
		for _, name := range names {
			s := newSem(t, b, name, 1)
			l, err := s.Acquire(ctx)
			require.NoError(t, err, "%q", name)
			_, err = s.TryAcquire(ctx)
			require.ErrorIs(t, err, ErrNoToken, "%q is held", name)
			require.NoError(t, l.Release(ctx))
		}
		// "}" and "%7D" must not collide: both were held at once above only
		// if their keys differ; check directly too.
		assert.NotEqual(t, newKeys("p:", "}").meta, newKeys("p:", "%7D").meta)
	})
}

func TestMutex(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		mu, err := NewMutex(b.pool, "mutex")
		require.NoError(t, err)
		l, err := mu.Lock(ctx)
		require.NoError(t, err)
		_, err = mu.TryLock(ctx)
		require.ErrorIs(t, err, ErrNoToken)

		got := acquireAsync(ctx, mu.Lock)
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, l.Release(ctx))
		l2, ok := <-got
		require.True(t, ok, "the blocked Lock acquires after Release")
		assert.Greater(t, l2.Fence(), l.Fence())
		require.NoError(t, l2.Release(ctx))
	})
}

func TestDelete(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "deleted", 2)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, s.Delete(ctx))
		assert.Equal(t, 0, b.keyCount(t))
		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.False(t, st.Exists)
		require.ErrorIs(t, l.Refresh(ctx, time.Second), ErrLeaseLost)
		require.ErrorIs(t, l.Release(ctx), ErrLeaseLost)

		// The next use recreates it under a new epoch; the old token is stray.
		l2, err := s.Acquire(ctx)
		require.NoError(t, err)
		assert.NotEqual(t, strings.Split(l.Token(), ":")[0], strings.Split(l2.Token(), ":")[0])
		b.do(t, "LPUSH", s.k.tokens, l.Token())
		require.NoError(t, l2.Release(ctx))
		st, err = s.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, st.Available)
		assert.Equal(t, 1, st.Stray)
	})
}
