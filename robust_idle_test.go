package redsem

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// idleTime is the idle expiry of these tests: short, so that real Redis
// expires the keys within the test.
const idleTime = 200 * time.Millisecond

// pass lets d go by: miniredis moves its TTLs, a real Redis is waited for.
func (b *backend) pass(d time.Duration) {
	if b.mini != nil {
		b.mini.FastForward(d)
		return
	}
	time.Sleep(d)
}

// tagKeys lists the keys under the semaphore's tag.
func tagKeys(t *testing.T, b *backend, s *Semaphore) []string {
	t.Helper()
	keys, err := redis.Strings(b.do(t, "KEYS", DefaultPrefix+"{"+s.name+"}*"), nil)
	require.NoError(t, err)
	return keys
}

// A semaphore used once and left idle leaves no key behind after the idle
// time, and Check then reports it as not existing; until then Status shows
// how long it has left.
func TestSemaphore_WithIdleExpiry_leavesNoKeys(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "idle-once", 3, WithIdleExpiry(idleTime))
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, idleTime, st.IdleExpiry)
		assert.Zero(t, st.IdleExpiresIn, "in use")
		require.NoError(t, l.Release(ctx))

		st, err = s.Status(ctx)
		require.NoError(t, err)
		assert.Greater(t, st.IdleExpiresIn, time.Duration(0))
		assert.LessOrEqual(t, st.IdleExpiresIn, idleTime)
		require.NotEmpty(t, tagKeys(t, b, s))

		b.pass(idleTime + 50*time.Millisecond)
		assert.Empty(t, tagKeys(t, b, s))
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.False(t, inv.Exists)
		assert.Empty(t, inv.Missing, "%+v", inv)
	})
}

// A holders key lost on its own while the semaphore was idle (evicted
// under a volatile-* policy, or deleted) takes holders' "idle" flag with it;
// the next acquisition writes it back, so the release after it still sets
// the expiry and the keys still go.
func TestSemaphore_WithIdleExpiry_afterHoldersLost(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "idle-holders-lost", 2, WithIdleExpiry(idleTime))
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		b.do(t, "DEL", s.k.holders)

		l, err = s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.Greater(t, st.IdleExpiresIn, time.Duration(0), "the release left it idle without an expiry")
		b.pass(idleTime + 50*time.Millisecond)
		assert.Empty(t, tagKeys(t, b, s))
	})
}

// A semaphore in use keeps its keys however long the idle time has passed:
// held, waited on, collected for by a weighted request, or draining after a
// shrink. Once it is idle again, its keys expire.
func TestSemaphore_WithIdleExpiry_neverWhileInUse(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		s := newSem(t, b, "idle-busy", 3, WithIdleExpiry(idleTime), WithTTL(10*time.Second))
		requireKept := func(what string) {
			t.Helper()
			b.pass(2 * idleTime)
			st, err := s.Status(ctx)
			require.NoError(t, err)
			require.True(t, st.Exists, what)
			require.Zero(t, st.IdleExpiresIn, what)
		}

		// Used, idle for a moment, used again: the second use keeps it.
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		l, err = s.Acquire(ctx)
		require.NoError(t, err)
		requireKept("held after an idle moment")

		// Held, while another lease comes and goes.
		l2, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l2.Release(ctx))
		requireKept("one of two released")

		// A weighted request collecting: it holds a partial lease of the
		// free tokens and waits for the held one.
		wctx, cancel := context.WithCancel(ctx)
		got := acquireAsync(wctx, func(ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, 3) })
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			return err == nil && st.Available == 0
		}, 5*time.Second, 5*time.Millisecond)
		requireKept("weighted collecting")
		cancel()
		<-got

		// A waiter registered for the only token.
		m := newSem(t, b, "idle-busy", 3, WithIdleExpiry(idleTime))
		ls := holdN(t, ctx, m.TryAcquire, 2)
		wctx, cancel = context.WithCancel(ctx)
		got = acquireAsync(wctx, m.Acquire)
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			return err == nil && st.Waiting == 1
		}, 5*time.Second, 5*time.Millisecond)
		requireKept("waited on")
		cancel()
		<-got

		// A shrink draining: size 1 while three are held.
		require.NoError(t, s.Resize(ctx, 1))
		for _, x := range ls {
			require.NoError(t, x.Release(ctx))
		}
		requireKept("draining")
		require.NoError(t, l.Release(ctx))

		// Idle now, with the tombstone of the cancelled waiter: the keys
		// expire when it does, not before.
		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.Greater(t, st.IdleExpiresIn, idleTime, "a tombstone outlives the idle time")
		assert.LessOrEqual(t, st.IdleExpiresIn, time.Duration(s.tombMs())*time.Millisecond)
	})
}

// Fences keep increasing across an expiry: the semaphore created again
// takes them from Redis TIME in µs, past every fence of the old epoch.
func TestSemaphore_WithIdleExpiry_fencesIncrease(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "idle-fence", 2, WithIdleExpiry(idleTime))
		var last int64
		var epochs []string
		for round := 0; round < 3; round++ {
			for i := 0; i < 3; i++ {
				l, err := s.Acquire(ctx)
				require.NoError(t, err)
				require.Greater(t, l.Fence(), last, "round %d", round)
				last = l.Fence()
				require.NoError(t, l.Release(ctx))
			}
			st, err := s.Status(ctx)
			require.NoError(t, err)
			epochs = append(epochs, st.Epoch)
			b.pass(idleTime + 50*time.Millisecond)
			require.Empty(t, tagKeys(t, b, s), "round %d", round)
		}
		assert.NotEqual(t, epochs[0], epochs[1])
		assert.NotEqual(t, epochs[1], epochs[2])
	})
}

// A weighted lease and an aborted acquisition leave the semaphore idle too.
func TestSemaphore_WithIdleExpiry_afterWeightedAndAbort(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "idle-n", 3, WithIdleExpiry(idleTime))
		l, err := s.AcquireN(ctx, 2)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		b.pass(idleTime + 50*time.Millisecond)
		require.Empty(t, tagKeys(t, b, s))

		// An acquisition granted whose reply was lost: abort gives it back.
		l, err = s.TryAcquire(ctx)
		require.NoError(t, err)
		r, err := s.abort(ctx, l.acqID, "release")
		require.NoError(t, err)
		require.Equal(t, int64(3), r.Code)
		b.pass(idleTime + 50*time.Millisecond)
		require.Empty(t, tagKeys(t, b, s))
		assert.ErrorIs(t, l.Release(ctx), ErrLeaseLost)
	})
}

func TestSemaphore_WithIdleExpiry_validates(t *testing.T) {
	t.Parallel()
	m := miniredisT(t)
	p := newPool(t, m.Addr())
	for _, d := range []time.Duration{-time.Second, time.Millisecond, minIdleExpiry - 1, MaxTTL + 1} {
		_, err := NewSemaphore(p, "x", 1, WithIdleExpiry(d))
		assert.ErrorIs(t, err, ErrInvalidOption, "%v", d)
	}
	for _, d := range []time.Duration{0, minIdleExpiry, time.Hour} {
		_, err := NewSemaphore(p, "x", 1, WithIdleExpiry(d))
		assert.NoError(t, err, "%v", d)
	}
}

// A resize or a repair of an idle semaphore rebuilds its token list: the
// expiry is set again on every key (found by the explorer: the new list
// outlived meta). A resize that creates the semaphore leaves it idle.
func TestSemaphore_WithIdleExpiry_afterResizeAndRepair(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "idle-resize", 2, WithIdleExpiry(idleTime), WithAdoptSize())
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, s.Resize(ctx, 1))
		b.pass(idleTime + 50*time.Millisecond)
		require.Empty(t, tagKeys(t, b, s), "after a shrink")

		require.NoError(t, s.Resize(ctx, 3))
		st, err := s.Status(ctx)
		require.NoError(t, err)
		require.True(t, st.Exists)
		assert.Greater(t, st.IdleExpiresIn, time.Duration(0))
		b.do(t, "RPUSH", s.k.tokens, "forged:1")
		_, err = s.Repair(ctx)
		require.NoError(t, err)
		b.pass(idleTime + 50*time.Millisecond)
		require.Empty(t, tagKeys(t, b, s), "after a repair")
	})
}

// An acquisition that fails on a key of the wrong type puts back what it
// took; on an idle semaphore it removes the expiry first, so no key it
// writes again outlives the others (found by the explorer: the token list,
// pushed back without a TTL, outlived meta).
func TestSemaphore_WithIdleExpiry_wrongTypeLeavesKeysTogether(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "idle-wt", 1, WithIdleExpiry(idleTime))
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		b.do(t, "SET", s.k.leases, "stranger")
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrWrongType)
		b.do(t, "DEL", s.k.leases)
		b.pass(idleTime + 50*time.Millisecond)
		st, err := s.Status(ctx)
		require.NoError(t, err)
		require.True(t, st.Exists, "in use since the failed acquisition: kept")
		assert.Equal(t, 1, st.Available)
		l, err = s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		b.pass(idleTime + 50*time.Millisecond)
		require.Empty(t, tagKeys(t, b, s))
	})
}

// The release that ends a shrink's drain leaves the semaphore idle: its keys
// expire after the idle time, whether that release put a withheld token back
// or dropped a retired one with the valid tokens already on the list. (The
// one-token fast release skipped the expiry while holders still had the
// shrink's "slow" flag.)
func TestSemaphore_WithIdleExpiry_afterAShrinkDrains(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, releaseFirst := range []bool{false, true} {
			ctx := ctxT(t, 10*time.Second)
			name := fmt.Sprintf("idle-shrink-%v", releaseFirst)
			s := newSem(t, b, name, 2, WithIdleExpiry(idleTime), WithAdoptSize())
			ls := holdN(t, ctx, s.Acquire, 2)
			// ls[0]'s token is valid after the shrink, ls[1]'s retired. It
			// goes back before the shrink, or is withheld while it drains.
			if releaseFirst {
				require.NoError(t, ls[0].Release(ctx))
			}
			require.NoError(t, s.Resize(ctx, 1))
			if !releaseFirst {
				require.NoError(t, ls[0].Release(ctx))
			}
			require.NoError(t, ls[1].Release(ctx)) // ends the drain
			requireInventory(t, s, 1, 0)
			b.pass(idleTime + 100*time.Millisecond)
			require.Empty(t, tagKeys(t, b, s), "%s: an idle semaphore kept its keys", name)
		}
	})
}

// A wait that ended with its outcome unknown leaves a tombstone in waits;
// the release that then leaves the semaphore idle sets the expiry all the
// same (at the tombstone's end if that is later), through the fast release
// too. The wait ends before any BLMOVE is sent: miniredis does not notice a
// client that closed while blocked, so a BLMOVE left behind would still
// take the released token there (Redis drops it with the client).
func TestSemaphore_WithIdleExpiry_withATombstoneInWaits(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		s := newSem(t, b, "idle-tomb", 1, WithIdleExpiry(idleTime))
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		// The waiter's first script registers it; its reply is lost and its
		// context ends: it settles by id, which leaves the tombstone.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var lose atomic.Bool
		lose.Store(true)
		hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
			if isScript(engine.Acquire.Script, cmd, args) && lose.Swap(false) {
				cancel()
				return redistest.ErrLostReply
			}
			return nil
		}}
		w, err := NewSemaphore(hp, "idle-tomb", 1, WithIdleExpiry(idleTime))
		require.NoError(t, err)
		_, err = w.Acquire(wctx)
		require.ErrorIs(t, err, context.Canceled)
		conn := b.pool.Get()
		waits, err := redis.Strings(conn.Do("ZRANGE", s.k.waits, 0, -1))
		conn.Close()
		require.NoError(t, err)
		require.Len(t, waits, 1, "one tombstone in waits")
		require.True(t, strings.HasPrefix(waits[0], "x:"), "a tombstone in waits: %v", waits)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, s, 1, 0)
		st, err := s.Status(ctx)
		require.NoError(t, err)
		require.Greater(t, st.IdleExpiresIn, time.Duration(0), "idle (a tombstone only) but no expiry set")

		// In use again (the fast path): no key expires, waits included.
		l, err = s.TryAcquire(ctx)
		require.NoError(t, err)
		for _, key := range []string{s.k.meta, s.k.holders, s.k.waits} {
			ttl, err := redis.Int(b.do(t, "PTTL", key), nil)
			require.NoError(t, err)
			assert.Equal(t, -1, ttl, "%s expires while in use", key)
		}
		require.NoError(t, l.Release(ctx))
	})
}

// A late run of a weighted request that holds nothing (here a try's run
// that lost the ticket) on an idle semaphore answers "settled" and leaves
// the idle expiry in place: the run took it off while it looked, and puts
// it back.
func TestSemaphore_WithIdleExpiry_lateWeightedRunKeepsIt(t *testing.T) {
	t.Parallel()
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
