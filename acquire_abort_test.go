package redsem

import (
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/redsem/redsem/internal/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// abort.lua settles only what its acquisition owns: an "a:" entry that
// points at a token leased by another acquisition (forged, or left stale)
// neither removes that holder's lease ("release") nor hands it over
// ("resolve").
func TestSemaphore_Acquire_abortLeavesAnotherHoldersLease(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, mode := range []string{"release", "resolve"} {
			ctx := ctxT(t, 10*time.Second)
			s := newSem(t, b, "abort-"+mode, 2, WithTTL(time.Minute))
			other, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			stale := engine.NewAcqID()
			b.do(t, "HSET", s.k.holders, "a:"+stale, other.Token())

			r, err := s.abort(ctx, stale, mode)
			require.NoError(t, err)
			assert.NotEqual(t, int64(1), r.Code, "%s: abort handed over another holder's lease", mode)

			inv, err := s.Check(ctx)
			require.NoError(t, err)
			assert.Equal(t, []string{other.Token()}, inv.Leased, "%s: the other holder's lease", mode)
			assert.True(t, inv.Healthy(), "%s: %+v", mode, inv)
			assert.NoError(t, other.Refresh(ctx, time.Minute), "%s: the other holder still holds", mode)
			// The acquisition got a tombstone, as any aborted one without a
			// lease does, and its stale entry is gone.
			n, err := redis.Int(b.do(t, "HEXISTS", s.k.holders, "a:"+stale), nil)
			require.NoError(t, err)
			assert.Zero(t, n, "%s: stale entry left", mode)
			require.NoError(t, other.Release(ctx))
			requireInventory(t, s, 2, 0)
		}
	})
}

// A token that a BLMOVE still registered moves into the pending list of an
// acquisition already settled (tombstoned) is swept once the tombstone
// expires, not at the next lease deadline: abort.lua lowers due to the
// tombstone's expiry, as every script that sets a deadline must.
func TestSemaphore_Acquire_abortTombstoneLowersDue(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 40*time.Second)
		s := newSem(t, b, "abort-due", 1, WithTTL(time.Minute))
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx)) // due is now a minute away

		acq := engine.NewAcqID()
		// A tombstone of 3s: long enough that a loaded machine's next
		// steps run before it expires (CI met 200ms passing first), far
		// below the minute to the next lease deadline.
		args := append(s.k.all(5), s.k.pend(acq), acq, "release", 3000)
		r, err := parseAcquireReply(engine.Abort.Do(b.pool.Get(), args...))
		require.NoError(t, err)
		require.Equal(t, int64(0), r.Code, "nothing held: a tombstone")
		// The late BLMOVE is served.
		b.do(t, "LMOVE", s.k.tokens, s.k.pend(acq), "LEFT", "RIGHT")
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)

		var got *Lease
		for end := time.Now().Add(20 * time.Second); got == nil && time.Now().Before(end); {
			if got, err = s.TryAcquire(ctx); err != nil {
				require.ErrorIs(t, err, ErrNoToken)
				time.Sleep(50 * time.Millisecond)
			}
		}
		require.NotNil(t, got, "the token stranded behind a 3s tombstone was not swept within 20s")
		require.NoError(t, got.Release(ctx))
		requireInventory(t, s, 1, 0)
	})
}

// Settling an acquisition that Redis granted (its reply lost): mode
// "resolve" hands the grant over as it was, token, fence and deadline,
// and keeps it; mode "release" then gives it back.
func TestSemaphore_Acquire_abortResolvesAGrant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "abort-resolve", 2, WithTTL(time.Minute))
		c, err := b.pool.GetContext(ctx)
		require.NoError(t, err)
		defer c.Close()
		acq := engine.NewAcqID()
		g, err := parseAcquireReply(engine.Acquire.Do(c, s.acquireCall(acq, 0, "fresh").KeysAndArgs...))
		require.NoError(t, err)
		require.Equal(t, int64(engine.CodeGranted), g.Code)

		r, err := s.abort(ctx, acq, "resolve")
		require.NoError(t, err)
		assert.Equal(t, int64(engine.CodeGranted), r.Code)
		assert.Equal(t, [3]interface{}{g.Tokens, g.Fence, g.DeadlineMs}, [3]interface{}{r.Tokens, r.Fence, r.DeadlineMs})
		requireInventory(t, s, 1, 1)
		r, err = s.abort(ctx, acq, "release")
		require.NoError(t, err)
		assert.Equal(t, int64(engine.CodeReleased), r.Code)
		requireInventory(t, s, 2, 0)
	})
}
