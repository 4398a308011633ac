package redsem

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// A weighted lease whose TTL passed and whose tokens were reclaimed: Release
// reports ErrLeaseLost and pushes nothing.
func TestLease_Release_weightedAfterReclaim(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "lost-n", 3, WithTTL(150*time.Millisecond), WithFixedTTL())
		l, err := s.AcquireN(ctx, 2)
		require.NoError(t, err)
		time.Sleep(200 * time.Millisecond)
		n, err := s.Reclaim(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		next, err := s.AcquireN(ctx, 3)
		require.NoError(t, err)
		assert.Greater(t, next.Fence(), l.Fence())
		require.ErrorIs(t, l.Release(ctx), ErrLeaseLost)
		assert.Equal(t, 0, b.llen(t, s.k.tokens), "no second copy of any token")
		require.NoError(t, next.Release(ctx))
		requireInventory(t, s, 3, 0)
	})
}

// Refresh extends every token of a weighted lease, or reports it lost if
// any is lost, and then extends none.
func refreshWeighted(t *testing.T) { // run by TestLease_Refresh_inTime
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		// TTLs of seconds: a loaded machine's late wake-ups cannot let the
		// lease lapse before or between two refreshes (300ms ones did).
		s := newSem(t, b, "refresh-n", 3, WithTTL(2*time.Second), WithFixedTTL())
		l, err := s.AcquireN(ctx, 3)
		require.NoError(t, err)
		scores := func() map[string]float64 {
			m := map[string]float64{}
			for _, tok := range l.Tokens() {
				f, err := redis.Float64(b.do(t, "ZSCORE", s.k.leases, tok), nil)
				require.NoError(t, err)
				m[tok] = f
			}
			return m
		}
		before := scores()
		for i := 0; i < 4; i++ {
			time.Sleep(150 * time.Millisecond)
			require.NoError(t, l.Refresh(ctx, 4*time.Second))
		}
		assert.True(t, l.Valid(), "held by refreshing")
		after := scores()
		var first float64
		for _, tok := range l.Tokens() {
			assert.Greater(t, after[tok], before[tok]+500, "token %s extended", tok)
			if first == 0 {
				first = after[tok]
			}
			assert.Equal(t, first, after[tok], "one deadline for all tokens")
		}

		// One token's server deadline moves into the past: Refresh reports
		// the lease lost and extends none of the others.
		lost := l.Tokens()[1]
		b.do(t, "ZADD", s.k.leases, "XX", 1, lost)
		kept := scores()
		require.ErrorIs(t, l.Refresh(ctx, time.Minute), ErrLeaseLost)
		assert.Equal(t, kept, scores())
		require.ErrorIs(t, l.Release(ctx), ErrLeaseLost)
		reclaimed := 0
		require.Eventually(t, func() bool {
			n, err := s.Reclaim(ctx)
			reclaimed += n
			if err != nil {
				return false
			}
			return reclaimed >= 3
		}, 30*time.Second, 50*time.Millisecond, "the three tokens come back by their deadlines")
		assert.Equal(t, 3, reclaimed)
		requireInventory(t, s, 3, 0)
	})
}

// A lease of more than releaseChunk tokens is released in several runs of
// release.lua; when some of its tokens were reclaimed, the rest still go
// back and Release reports the lease lost.
func TestLease_Release_largeLeaseInChunks(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 2*releaseChunk + 50
		cp, runs := countRuns(b.pool, engine.Release.Script)
		s, err := NewSemaphore(cp, "release-chunks", size, WithFixedTTL(), WithTTL(time.Minute))
		require.NoError(t, err)
		l, err := s.AcquireN(ctx, size)
		require.NoError(t, err)
		runs.Store(0)
		require.NoError(t, l.Release(ctx))
		assert.Equal(t, int64(3), runs.Load())
		requireInventory(t, s, size, 0)
		require.ErrorIs(t, l.Release(ctx), ErrReleased)

		l, err = s.AcquireN(ctx, size)
		require.NoError(t, err)
		lost := l.Tokens()[releaseChunk+10] // in the second run's share
		b.do(t, "ZADD", s.k.leases, "XX", 1, lost)
		n, err := s.Reclaim(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.ErrorIs(t, l.Release(ctx), ErrLeaseLost)
		requireInventory(t, s, size, 0)
		assert.Equal(t, size, b.llen(t, s.k.tokens), "no second copy of any token")
	})
}

// A Release of several runs that fails half way has ended the lease on
// this side already (its first run's tokens may be another's by then), and
// a second Release goes on with the tokens not given back yet.
func TestLease_Release_halfDoneEndsTheLease(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 300
		var runs, failFrom atomic.Int64
		failFrom.Store(2)
		hp := &hookPool{Pool: b.pool, BeforeDo: func(cmd string, args []interface{}) error {
			if isScript(engine.Release.Script, cmd, args) && runs.Add(1) >= failFrom.Load() {
				return errLink
			}
			return nil
		}}
		s, err := NewSemaphore(hp, "half-release", size, WithFixedTTL(), WithTTL(time.Minute))
		require.NoError(t, err)
		l, err := s.AcquireN(ctx, size)
		require.NoError(t, err)
		require.ErrorIs(t, l.Release(ctx), errLink)
		assert.False(t, l.Valid())
		assert.Error(t, l.Context().Err())
		other := newSem(t, b, "half-release", size)
		l2, err := other.TryAcquireN(ctx, releaseChunk)
		require.NoError(t, err, "the first run's tokens went back")
		require.NoError(t, l2.Release(ctx))

		failFrom.Store(1 << 40) // the link is back
		require.NoError(t, l.Release(ctx))
		assert.ErrorIs(t, l.Err(), ErrReleased)
		requireInventory(t, other, size, 0)
	})
}

// A Release whose outcome is unknown (a connection error: Redis may have
// run it) ends the lease on the client's side (Done closed, Valid false),
// and a second one, once Redis answers, gives it back.
func TestLease_Release_ofUnknownOutcomeEndsTheLease(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		var down atomic.Bool
		down.Store(true)
		hp := &hookPool{Pool: b.pool, BeforeDo: func(cmd string, args []interface{}) error {
			if down.Load() && isScript(engine.Release.Script, cmd, args) {
				return errLink
			}
			return nil
		}}
		s, err := NewSemaphore(hp, "ends-first", 1)
		require.NoError(t, err)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, l.Release(ctx), errLink)
		select {
		case <-l.Done():
		default:
			t.Fatal("Done not closed by a Release that was never sent")
		}
		assert.False(t, l.Valid())
		requireInventory(t, s, 0, 1)
		down.Store(false)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// A lease of more than refreshChunk tokens is refreshed in several runs of
// refresh.lua, each extending its share: afterwards every token's server
// deadline is the new one, and the local deadline moved up with them.
func TestLease_Refresh_largeLeaseInRuns(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 2*refreshChunk + 50
		cp, runs := countRuns(b.pool, engine.Refresh.Script)
		s, err := NewSemaphore(cp, "refresh-runs", size, WithFixedTTL(), WithTTL(10*time.Second))
		require.NoError(t, err)
		l, err := s.AcquireN(ctx, size)
		require.NoError(t, err)
		before := l.Deadline()
		runs.Store(0)
		require.NoError(t, l.Refresh(ctx, time.Minute))
		assert.Equal(t, int64(3), runs.Load())
		assert.True(t, l.Deadline().After(before.Add(40*time.Second)), "local deadline raised")
		scores, err := redis.Int64Map(b.do(t, "ZRANGE", s.k.leases, 0, -1, "WITHSCORES"), nil)
		require.NoError(t, err)
		require.Len(t, scores, size)
		for tok, ms := range scores {
			assert.Greater(t, ms, time.Now().Add(50*time.Second).UnixMilli(), "token %s extended", tok)
		}
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, size, 0)
	})
}

// A refresh whose later run finds the lease lost (one of its tokens was
// reclaimed) ends the lease and gives back the tokens still recorded for it,
// those an earlier run extended included: they do not stay held one more
// TTL.
func TestLease_Refresh_lostHalfWayGivesBack(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 2*refreshChunk + 50
		s, err := NewSemaphore(b.pool, "refresh-lost", size, WithFixedTTL(), WithTTL(time.Minute))
		require.NoError(t, err)
		l, err := s.AcquireN(ctx, size)
		require.NoError(t, err)
		lost := l.Tokens()[refreshChunk+10] // in the second run's share
		b.do(t, "ZADD", s.k.leases, "XX", 1, lost)
		n, err := s.Reclaim(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.ErrorIs(t, l.Refresh(ctx, time.Minute), ErrLeaseLost)
		assert.False(t, l.Valid())
		requireInventory(t, s, size, 0)
		assert.Equal(t, size, b.llen(t, s.k.tokens), "every token back, once")
		require.ErrorIs(t, l.Release(ctx), ErrLeaseLost)
	})
}

// A refresh of several runs that outlives the lease's local deadline sends
// no further run, and gives back the tokens Redis still records for it (the
// first run extended part of them by a new TTL).
func TestLease_Refresh_endedBetweenRunsExtendsNoMore(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 2*refreshChunk + 50
		var l *Lease
		var runs atomic.Int64
		// Loaded first, so that the hook below follows the first run itself,
		// not an EVALSHA answered NOSCRIPT (whose EVAL would then come after
		// the lease ended, and find it lost).
		conn := b.pool.Get()
		require.NoError(t, engine.Refresh.Load(conn))
		conn.Close()
		hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
			if isScript(engine.Refresh.Script, cmd, args) && runs.Add(1) == 1 {
				for l.Valid() { // the lease expires while the first run is on the wire
					time.Sleep(time.Millisecond)
				}
			}
			return nil
		}}
		s, err := NewSemaphore(hp, "refresh-expired", size, WithFixedTTL(), WithTTL(time.Second))
		require.NoError(t, err)
		l, err = s.AcquireN(ctx, size)
		require.NoError(t, err)
		require.ErrorIs(t, l.Refresh(ctx, time.Minute), ErrLeaseExpired)
		assert.Equal(t, int64(1), runs.Load(), "no run after the lease ended")
		requireInventory(t, s, size, 0)
		assert.Equal(t, size, b.llen(t, s.k.tokens), "every token back, once")
		require.NoError(t, l.Release(ctx), "given back already")
	})
}

// The local deadline after a refresh of several runs is the earliest of the
// runs' deadlines, not the first run's: a later run's Redis TIME may be
// behind (a clock stepped back, another node after a failover).
func TestLease_Refresh_runsTakeTheEarliestDeadline(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	b := &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
	ctx := ctxT(t, 30*time.Second)
	const size = 2*refreshChunk + 50
	var runs atomic.Int64
	var stepped time.Time // miniredis's TIME from the second run on (fixed)
	hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
		if isScript(engine.Refresh.Script, cmd, args) && runs.Add(1) == 1 {
			stepped = time.Now().Add(-3 * time.Second)
			m.SetTime(stepped)
		}
		return nil
	}}
	s, err := NewSemaphore(hp, "refresh-earliest", size, WithFixedTTL(), WithTTL(10*time.Second))
	require.NoError(t, err)
	l, err := s.AcquireN(ctx, size)
	require.NoError(t, err)
	c := b.pool.Get()
	require.NoError(t, engine.Refresh.Load(c)) // the first run is EVALSHA's, not a NOSCRIPT
	c.Close()
	require.NoError(t, l.Refresh(ctx, 10*time.Second))
	require.Equal(t, int64(3), runs.Load())
	scores, err := redis.Int64Map(b.do(t, "ZRANGE", s.k.leases, 0, -1, "WITHSCORES"), nil)
	require.NoError(t, err)
	earliest := int64(1 << 62)
	for _, ms := range scores {
		earliest = min(earliest, ms)
	}
	serverLeft := time.Duration(earliest-stepped.UnixMilli()) * time.Millisecond
	assert.LessOrEqual(t, time.Until(l.Deadline()), serverLeft,
		"Valid() must end before the earliest token's deadline in Redis")
}

var errLink = errors.New("test: link down")
