package redsem

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
		r, err := parseAcquireNReply(engine.AcquireN.Do(c, s.acquireNCall(acq, k, 0, phase).KeysAndArgs...))
		require.NoError(t, err)
		return r
	}
}

// countRuns returns a pool that counts the runs of script sent through it.
func countRuns(p Pool, script *engine.Script) (*hookPool, *atomic.Int64) {
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
func TestSemaphore_TryAcquireN_largeTakesSteps(t *testing.T) {
	t.Parallel()
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
		cp, runsN := countRuns(b.pool, engine.AcquireN.Script)
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

// A grant sealed over several runs checks, each run, that the tokens it is
// about to seal are still the ones it collected: a stranger's element in
// the part list makes it give everything back and settle, never seal the
// stranger's token into a grant.
func TestSemaphore_TryAcquireN_sealChecksWhatItCollected(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		const size = 300
		s := newSem(t, b, "try-seal", size)
		acq, run := tryRuns(t, b, s, size)
		part := s.k.base + "part:" + acq
		sealing := func() bool {
			n, err := redis.Int(b.do(t, "HEXISTS", s.k.meta, "seal"), nil)
			require.NoError(t, err)
			return n == 1
		}
		r := run("fresh")
		for i := 0; r.Code == engine.CodeWaiting && !sealing(); i++ {
			require.Less(t, i, 20)
			r = run("more")
		}
		require.Equal(t, int64(engine.CodeWaiting), r.Code, "sealing takes more than one run")
		last := b.do(t, "LINDEX", part, -1) // not sealed yet
		b.do(t, "LINSERT", part, "BEFORE", last, "garbage")
		for i := 0; r.Code == engine.CodeWaiting; i++ {
			require.Less(t, i, 20)
			r = run("more")
		}
		assert.Equal(t, int64(engine.CodeSettled), r.Code, "got %v", r.Tokens)
		requireInventory(t, s, size, 0)
	})
}

// stepLine returns weighted.lua's line that sets STEP.
func stepLine(t *testing.T) string {
	for _, line := range strings.Split(engine.Source("acquire_n.lua"), "\n") {
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
func TestSemaphore_TryAcquireN_largeGivesUpHalfWay(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		// One run takes tryStep; two tokens are left for the next. The
		// test's steps between two runs are few: the try's ticket lapses a
		// second after its last run (a loaded machine took that for a
		// hundred acquisitions).
		const size = tryStep + 2
		s := newSem(t, b, "try-gives-up", size)
		_, run := tryRuns(t, b, s, size)
		r := run("fresh")
		require.Equal(t, int64(modeMore), r.Mode)
		require.Len(t, collecting(t, s), tryStep)

		_, err := s.TryAcquireN(ctx, 2)
		require.ErrorIs(t, err, ErrNoToken, "a weighted request collects")
		_, other := tryRuns(t, b, s, 2)
		o := other("fresh")
		assert.Equal(t, [3]int64{engine.CodeWaiting, 0, 0}, [3]int64{o.Code, int64(o.Block), o.Mode},
			"refused, not now, and nothing to wait for")
		single, err := s.TryAcquire(ctx) // one of the two left
		require.NoError(t, err)

		r = run("more")
		assert.Equal(t, int64(engine.CodeWaiting), r.Code)
		assert.Equal(t, int64(0), r.Mode, "refused")
		requireInventory(t, s, size-1, 1)
		assert.Equal(t, 0, extraKeys(t, b, s))
		assert.Equal(t, 0, b.zcard(t, s.k.waits), "the refused try's registration went with it")

		// The ticket is free again: a try of two goes through.
		l, err := s.TryAcquireN(ctx, 2)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, single.Release(ctx))
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

// A TryAcquireN over several runs is granted with the shortest grace too:
// its next run must not find its own ticket already dead.
func TestSemaphore_TryAcquireN_largeWithNoGrace(t *testing.T) {
	t.Parallel()
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
func TestSemaphore_TryAcquireN_leavesNoDoorbell(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		// One run takes tryStep, two releases bring the rest; the steps
		// between two runs are few, as the try's ticket lapses a second
		// after its last run (a loaded machine took that for 172
		// acquisitions and releases).
		const size = tryStep + 2
		s := newSem(t, b, "try-bell", size)
		acq, run := tryRuns(t, b, s, size)
		r := run("fresh")
		require.Equal(t, int64(modeMore), r.Mode)
		singles := holdN(t, ctx, s.TryAcquire, size-tryStep)
		for _, h := range singles {
			require.NoError(t, h.Release(ctx)) // each goes to the try
		}
		require.Equal(t, 1, b.llen(t, s.k.bell(acq)), "rung by the release that completed it")
		ttl, err := redis.Int(b.do(t, "PTTL", s.k.bell(acq)), nil)
		require.NoError(t, err)
		assert.Positive(t, ttl, "a doorbell nobody answers expires")
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
