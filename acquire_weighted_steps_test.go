package redsem

import (
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

// tryRuns runs a TryAcquireN of k on s by hand, one run of acquire_n.lua at
// a time on one connection: run("fresh") first, then run("more").
func tryRuns(t *testing.T, b *backend, s *Semaphore, k int) (string, func(phase string) engine.Reply) {
	acq := engine.NewAcqID()
	c := b.pool.Get()
	t.Cleanup(func() { c.Close() })
	return acq, func(phase string) engine.Reply {
		t.Helper()
		r, err := parseAcquireNReply(engine.AcquireN.Do(c, s.acquireNArgs(acq, k, 0, phase)...))
		require.NoError(t, err)
		return r
	}
}

// countRuns returns a pool that counts the runs of script sent through it.
func countRuns(p Pool, script *redis.Script) (*hookPool, *atomic.Int64) {
	n := &atomic.Int64{}
	return &hookPool{Pool: p, AfterDo: func(cmd string, args []interface{}) error {
		if isScript(script, cmd, args) {
			n.Add(1)
		}
		return nil
	}}, n
}

// TryAcquireN of more than tryStep tokens takes them over several runs of
// acquire_n.lua, tryStep at most a run, and grants all k with one fence.
func TestTryAcquireNLargeTakesSteps(t *testing.T) {
	require.Equal(t, "local STEP = 128", stepLine(t), "tryStep is weighted.lua's STEP")
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 300
		s := newSem(t, b, "try-steps", size)
		// Run by run, on the script itself: each run before the grant asks
		// for another at once (mode 3) and has collected tryStep more at
		// most.
		acq, run := tryRuns(t, b, s, size)
		phase, have, runs := "fresh", 0, 0
		var r engine.Reply
		for {
			r = run(phase)
			runs++
			if r.Code == engine.CodeGranted {
				break
			}
			require.Equal(t, int64(engine.CodeWaiting), r.Code)
			require.Equal(t, int64(modeMore), r.Mode, "run %d asks to run again", runs)
			now := len(collecting(t, s))
			require.LessOrEqual(t, now-have, tryStep, "run %d took %d tokens", runs, now-have)
			have, phase = now, "more"
			require.Less(t, runs, 20)
		}
		assert.GreaterOrEqual(t, runs, 3)
		require.Len(t, r.Tokens, size)
		st, err := s.Status(ctx)
		require.NoError(t, err)
		require.Len(t, st.Holders, size)
		for _, h := range st.Holders {
			require.Equal(t, r.Fence, h.Fence, "one fence for the whole lease")
		}
		l := s.newLease(acq, r, monoNow())
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, size, 0)

		// Through the API.
		cp, runsN := countRuns(b.pool, engine.AcquireN)
		s2, err := NewSemaphore(cp, "try-steps", size)
		require.NoError(t, err)
		l, err = s2.TryAcquireN(ctx, size)
		require.NoError(t, err)
		require.Len(t, l.Tokens(), size)
		assert.GreaterOrEqual(t, runsN.Load(), int64(3))
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, size, 0)
		assert.Equal(t, 0, extraKeys(t, b, s))
	})
}

// stepLine returns weighted.lua's line that sets STEP.
func stepLine(t *testing.T) string {
	for _, line := range strings.Split(engine.MustRead("weighted.lua"), "\n") {
		if strings.HasPrefix(line, "local STEP ") {
			return line
		}
	}
	t.Fatal("weighted.lua sets no STEP")
	return ""
}

// A TryAcquireN that finds too few free tokens half way gives back
// everything it collected and the ticket, and refuses; while it collects,
// other weighted requests wait for the ticket (a try is refused), and get
// it after.
func TestTryAcquireNLargeGivesUpHalfWay(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 300
		s := newSem(t, b, "try-gives-up", size)
		_, run := tryRuns(t, b, s, size)
		r := run("fresh")
		require.Equal(t, int64(modeMore), r.Mode)
		require.Len(t, collecting(t, s), tryStep)

		_, err := s.TryAcquireN(ctx, 2)
		require.ErrorIs(t, err, ErrNoToken, "a weighted request collects")
		singles := holdN(t, ctx, s.TryAcquire, 100)

		r = run("more")
		assert.Equal(t, int64(engine.CodeWaiting), r.Code)
		assert.Equal(t, int64(0), r.Mode, "refused")
		requireInventory(t, s, size-100, 100)
		assert.Equal(t, 0, extraKeys(t, b, s))

		// The ticket is free again: a try of two goes through.
		l, err := s.TryAcquireN(ctx, 2)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		for _, h := range singles {
			require.NoError(t, h.Release(ctx))
		}
		requireInventory(t, s, size, 0)

		// Through the API: with a single holder, a try of all is refused
		// at once and holds nothing after.
		h, err := s.Acquire(ctx)
		require.NoError(t, err)
		_, err = s.TryAcquireN(ctx, size)
		require.ErrorIs(t, err, ErrNoToken)
		requireInventory(t, s, size-1, 1)
		require.NoError(t, h.Release(ctx))
	})
}

// A lease of more than releaseChunk tokens is released in several runs of
// release.lua; when some of its tokens were reclaimed, the rest still go
// back and Release reports the lease lost.
func TestReleaseLargeLeaseInChunks(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 2*releaseChunk + 50
		cp, runs := countRuns(b.pool, engine.Release)
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

// A TryAcquireN over several runs is granted with the shortest grace too:
// its next run must not find its own ticket already dead.
func TestTryAcquireNLargeWithNoGrace(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		s := newSem(t, b, "try-grace0", 300, WithGrace(0))
		l, err := s.TryAcquireN(ctx, 200)
		require.NoError(t, err, "300 of 300 tokens are free")
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 300, 0)
	})
}

// A release that completes a TryAcquireN's collection rings its doorbell;
// the try's next run removes it, so nothing of the try is left once it is
// granted.
func TestTryAcquireNLeavesNoDoorbell(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 300
		if b.mini != nil {
			// The try's ticket lives a second of server time; the 172
			// acquisitions and releases below take about that on miniredis
			// under -race beside other tests.
			b.mini.SetTime(time.Now())
		}
		s := newSem(t, b, "try-bell", size)
		acq, run := tryRuns(t, b, s, size)
		r := run("fresh")
		require.Equal(t, int64(modeMore), r.Mode)
		singles := holdN(t, ctx, s.TryAcquire, size-tryStep)
		for _, h := range singles {
			require.NoError(t, h.Release(ctx)) // each goes to the try
		}
		require.Equal(t, 1, b.llen(t, s.k.bell(acq)), "rung by the release that completed it")
		for i := 0; i < 10 && r.Code != engine.CodeGranted; i++ {
			r = run("more")
		}
		require.Equal(t, int64(engine.CodeGranted), r.Code)
		assert.Equal(t, 0, b.llen(t, s.k.bell(acq)), "doorbell of a granted try")
		l := s.newLease(acq, r, monoNow())
		require.NoError(t, l.Release(ctx))
		assert.Equal(t, 0, extraKeys(t, b, s))
	})
}

// A Release of several runs that fails half way has ended the lease on
// this side already (its first run's tokens may be another's by then), and
// a second Release goes on with the tokens not given back yet.
func TestReleaseHalfDoneEndsTheLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 300
		var runs, failFrom atomic.Int64
		failFrom.Store(2)
		hp := &hookPool{Pool: b.pool, BeforeDo: func(cmd string, args []interface{}) error {
			if isScript(engine.Release, cmd, args) && runs.Add(1) >= failFrom.Load() {
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

var errLink = errors.New("test: link down")

// A Release whose outcome is unknown (a connection error: Redis may have
// run it) ends the lease on the client's side (Done closed, Valid false),
// and a second one, once Redis answers, gives it back.
func TestReleaseOfUnknownOutcomeEndsTheLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		var down atomic.Bool
		down.Store(true)
		hp := &hookPool{Pool: b.pool, BeforeDo: func(cmd string, args []interface{}) error {
			if down.Load() && isScript(engine.Release, cmd, args) {
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
func TestRefreshLargeLeaseInRuns(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const size = 2*refreshChunk + 50
		cp, runs := countRuns(b.pool, engine.Refresh)
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
func TestRefreshLostHalfWayGivesBack(t *testing.T) {
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
func TestRefreshEndedBetweenRunsExtendsNoMore(t *testing.T) {
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
			if isScript(engine.Refresh, cmd, args) && runs.Add(1) == 1 {
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
func TestRefreshRunsTakeTheEarliestDeadline(t *testing.T) {
	m := miniredis.RunT(t)
	b := &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
	ctx := ctxT(t, 30*time.Second)
	const size = 2*refreshChunk + 50
	var runs atomic.Int64
	var stepped time.Time // miniredis's TIME from the second run on (fixed)
	hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
		if isScript(engine.Refresh, cmd, args) && runs.Add(1) == 1 {
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

// A late run of a weighted request that holds nothing (here a try's run
// that lost the ticket) on an idle semaphore answers "settled" and leaves
// the idle expiry in place: the run took it off while it looked, and puts
// it back.
func TestLateWeightedRunKeepsTheIdleExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "late-weighted-idle", 300, WithIdleExpiry(time.Minute))
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		st, err := s.Status(ctx)
		require.NoError(t, err)
		require.Greater(t, st.IdleExpiresIn, time.Duration(0), "idle after the release")

		_, run := tryRuns(t, b, s, 200)
		r := run("more") // never ran "fresh": it holds no ticket
		require.Equal(t, int64(engine.CodeSettled), r.Code)
		st, err = s.Status(ctx)
		require.NoError(t, err)
		assert.Greater(t, st.IdleExpiresIn, time.Duration(0), "still idle: the expiry is back")
	})
}
