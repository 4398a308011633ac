package admin

import (
	"context"

	"github.com/alicebob/miniredis/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/rate"
)

func TestParseMetaKey(t *testing.T) {
	for key, want := range map[string]Found{
		"p:{a}:meta":         {"a", KindSemaphore},
		"p:{a}:rate:meta":    {"a", KindRate},
		"p:{a}:rw:meta":      {"a", KindRWMutex},
		"p:{a}:el:meta":      {"a", KindElection},
		"p:{a}:el:x:meta":    {},
		"p:{a}:rw:x:meta":    {},
		"p:{a%20b}:meta":     {"a b", KindSemaphore},
		"p:{%7Bx%7D}:meta":   {"{x}", KindSemaphore},
		"p:{rate}:meta":      {"rate", KindSemaphore},
		"p:{a}:rate:x:meta":  {},
		"p:{a}:pend:x:meta":  {},
		"p:{}:meta":          {},
		"p:{a%2}:meta":       {},
		"q:{a}:meta":         {},
		"p:x{a}:meta":        {},
		"p:{a}:metameta":     {},
		"p:{a}:meta:rate":    {},
		"p:{a}:{rate}:meta ": {},
	} {
		got, ok := parseMetaKey("p:", key)
		assert.Equal(t, want.Name != "", ok, key)
		assert.Equal(t, want, got, key)
	}
}

// ScanNames finds every semaphore, mutex, lock, rate gate and election under the prefix,
// names of any bytes included, and nothing else: not other prefixes (even
// one the prefix matches as a glob), not pending lists, not keys redsem
// would not have written.
func TestScanNamesFindsEveryKind(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		const prefix = "f*[l]?:"
		odd := []string{"plain", "a b", "x{y}", "ü", "%41", "100%", "both", "m"}
		for _, name := range odd[:len(odd)-1] {
			_, err := newSem(t, b, name, 2, redsem.WithPrefix(prefix), redsem.WithFixedTTL()).TryAcquire(ctx)
			require.NoError(t, err)
		}
		mu, err := redsem.NewMutex(b.pool, "m", redsem.WithPrefix(prefix), redsem.WithFixedTTL())
		require.NoError(t, err)
		_, err = mu.TryLock(ctx)
		require.NoError(t, err)
		for _, name := range []string{"api", "both"} {
			_, err := newRateGate(t, b, name, 3, time.Hour, rate.WithPrefix(prefix)).Allow(ctx)
			require.NoError(t, err)
		}
		rw, err := redsem.NewRWMutex(b.pool, "lock", redsem.WithPrefix(prefix), redsem.WithFixedTTL())
		require.NoError(t, err)
		_, err = rw.TryLock(ctx)
		require.NoError(t, err)
		el, err := redsem.NewElection(b.pool, "sched", redsem.WithPrefix(prefix))
		require.NoError(t, err)
		lead, err := el.Campaign(ctx, "me")
		require.NoError(t, err)
		t.Cleanup(func() { _ = lead.Resign(context.Background()) })
		// Decoys: another prefix the unquoted pattern would match, the
		// default prefix, a non-canonical encoding, a look-alike suffix.
		for _, p := range []string{"fxlx:", "f*[l]?x:", redsem.DefaultPrefix} {
			_, err := newSem(t, b, "decoy", 1, redsem.WithPrefix(p), redsem.WithFixedTTL()).TryAcquire(ctx)
			require.NoError(t, err)
		}
		b.do(t, "HSET", prefix+"{%4a}:meta", "size", 1)
		b.do(t, "HSET", prefix+"{z}:other:meta", "size", 1)

		names, err := ScanNames(ctx, b.pool, prefix, ScanLimits{Limit: 100})
		require.NoError(t, err)
		assert.False(t, names.Truncated)
		want := []Found{
			{"%41", KindSemaphore}, {"100%", KindSemaphore}, {"a b", KindSemaphore},
			{"both", KindSemaphore}, {"m", KindSemaphore}, {"plain", KindSemaphore},
			{"x{y}", KindSemaphore}, {"ü", KindSemaphore},
			{"lock", KindRWMutex},
			{"api", KindRate}, {"both", KindRate},
			{"sched", KindElection},
		}
		assert.Equal(t, want, names.Found)
	})
}

func TestScanNamesStopsAtTheLimit(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		for i := 0; i < 7; i++ {
			_, err := newSem(t, b, "s"+strconv.Itoa(i), 1, redsem.WithFixedTTL()).TryAcquire(ctx)
			require.NoError(t, err)
		}
		for _, c := range []struct {
			limit, found int
			truncated    bool
		}{{3, 3, true}, {6, 6, true}, {7, 7, false}, {100, 7, false}} {
			names, err := ScanNames(ctx, b.pool, redsem.DefaultPrefix, ScanLimits{Limit: c.limit})
			require.NoError(t, err)
			assert.Len(t, names.Found, c.found, "limit %d", c.limit)
			assert.Equal(t, c.truncated, names.Truncated, "limit %d", c.limit)
		}
	})
}

func TestScanNamesRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	pool := newPool(t, m.Addr())
	for _, c := range []struct {
		pool   Pool
		prefix string
		lim    ScanLimits
	}{
		{nil, "p:", ScanLimits{}},
		{pool, "p{", ScanLimits{}},
		{pool, string(make([]byte, engine.MaxPrefixLen+1)), ScanLimits{}},
		{pool, "p:", ScanLimits{Limit: -1}},
		{pool, "p:", ScanLimits{MaxScan: -1}},
	} {
		_, err := ScanNames(ctx, c.pool, c.prefix, c.lim)
		assert.ErrorIs(t, err, redsem.ErrInvalidOption, "%q %+v", c.prefix, c.lim)
		_, err = ReadFleet(ctx, c.pool, c.prefix, c.lim)
		assert.ErrorIs(t, err, redsem.ErrInvalidOption, "%q %+v", c.prefix, c.lim)
	}
}

// The zero ScanLimits are the defaults: DefaultScanLimit names.
func TestScanLimitsZeroIsDefault(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	m := miniredis.RunT(t)
	b := &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
	for i := 0; i < DefaultScanLimit+1; i++ {
		b.do(t, "HSET", key(redsem.DefaultPrefix, "s"+strconv.Itoa(i), "meta"), "size", 1)
	}
	names, err := ScanNames(ctx, b.pool, redsem.DefaultPrefix, ScanLimits{})
	require.NoError(t, err)
	assert.Len(t, names.Found, DefaultScanLimit)
	assert.True(t, names.Truncated)
}

// ReadFleet reports each semaphore's state as Status does, with the expired
// leases and the oldest hold, each read-write lock's as RWStatus does, each
// rate gate's starts in the current window, and a name whose keys are
// unreadable in Failed.
func TestReadFleet(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const prefix = "fleet:"
		busy := newSem(t, b, "busy", 4, redsem.WithPrefix(prefix), redsem.WithFixedTTL())
		held := holdN(t, ctx, busy.TryAcquire, 3)
		// One lease's deadline is moved into the past: expired, not reclaimed.
		b.do(t, "ZADD", key(prefix, "busy", "leases"), "XX", time.Now().Add(-time.Minute).UnixMilli(), held[0].Token())
		b.do(t, "RPUSH", key(prefix, "busy", "tokens"), "forged")
		time.Sleep(30 * time.Millisecond) // so the oldest hold is measurably old

		idle := newSem(t, b, "idle", 2, redsem.WithPrefix(prefix), redsem.WithFixedTTL())
		l, err := idle.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))

		gate := newRateGate(t, b, "api", 5, time.Hour, rate.WithPrefix(prefix))
		for i := 0; i < 3; i++ {
			_, err := gate.Allow(ctx)
			require.NoError(t, err)
		}
		// A waiter whose liveness deadline passed (its client died) is not
		// counted as waiting.
		b.do(t, "ZADD", prefix+"{api}:rate:waits", time.Now().Add(-time.Minute).UnixMicro(), "w:dead")

		b.do(t, "SET", prefix+"{broken}:meta", "not a hash")

		rw, err := redsem.NewRWMutex(b.pool, "lock", redsem.WithPrefix(prefix), redsem.WithFixedTTL())
		require.NoError(t, err)
		_, err = rw.TryRLock(ctx)
		require.NoError(t, err)

		fl, err := ReadFleet(ctx, b.pool, prefix, ScanLimits{Limit: 100})
		require.NoError(t, err)
		assert.False(t, fl.Truncated)
		require.Len(t, fl.Semaphores, 2)
		st := fl.Semaphores[0]
		assert.Equal(t, "busy", st.Name)
		assert.Equal(t, 4, st.Size)
		assert.Len(t, st.Holders, 3)
		assert.Equal(t, 1, st.Available)
		assert.Equal(t, 1, st.Stray)
		assert.Equal(t, 0, st.Waiting)
		assert.Equal(t, 1, st.Expired())
		assert.GreaterOrEqual(t, st.OldestHold(), 30*time.Millisecond)
		assert.Less(t, st.OldestHold(), time.Minute)

		st = fl.Semaphores[1]
		assert.Equal(t, "idle", st.Name)
		assert.Equal(t, 2, st.Available)
		assert.Empty(t, st.Holders)
		assert.Zero(t, st.Expired())
		assert.Zero(t, st.OldestHold())

		require.Len(t, fl.RateGates, 1)
		rs := fl.RateGates[0]
		assert.Equal(t, "api", rs.Name)
		assert.True(t, rs.Exists)
		assert.Equal(t, 5, rs.Limit)
		assert.Equal(t, time.Hour, rs.Per)
		assert.Equal(t, 3, rs.Started)
		assert.Equal(t, 2, rs.Available)
		assert.Equal(t, 0, rs.Due)
		assert.Equal(t, 0, rs.Waiting)
		assert.Equal(t, 0, rs.Stray)

		require.Len(t, fl.RWMutexes, 1)
		assert.Equal(t, "lock", fl.RWMutexes[0].Name)
		assert.Len(t, fl.RWMutexes[0].Readers, 1)
		assert.Nil(t, fl.RWMutexes[0].Writer)

		require.Len(t, fl.Failed, 1)
		assert.Equal(t, "broken", fl.Failed[0].Name)
		assert.ErrorIs(t, fl.Failed[0].Err, redsem.ErrWrongType)
	})
}
