package redsem

// The Semaphore's own tests: its constructor, its names and its options.
// What it does (Acquire, Release, Refresh) is in acquire_*_test.go and
// lease_*_test.go.

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/rate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Odd names are encoded so that all keys of one semaphore share one hash tag
// and two different names never share keys.
func TestSemaphore_New_oddNames(t *testing.T) {
	t.Parallel()
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

// Each package takes only its own options: a semaphore's option given to
// rate.New (redsem.WithTTL has no meaning for a rate gate), or a rate
// gate's to NewSemaphore, does not compile, since neither option type can
// implement the other's unexported method. The table lists every option of
// both packages.
func TestSemaphore_Options_typedPerPackage(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
