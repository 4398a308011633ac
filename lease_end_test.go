package redsem

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// A lease whose refreshes all failed (Redis gone) expires with a cause that
// says so: ErrLeaseExpired and the last refresh's error, for errors.Is
// alike, in Err and in its Context's cause.
func TestLease_Err_afterFailedRefreshesCarriesTheirError(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		s := newSem(t, b, "refresh-outage", 1, WithTTL(3*time.Second))
		l, err := s.Acquire(ctxT(t, 10*time.Second))
		require.NoError(t, err)
		if b.mini != nil {
			b.mini.Close()
		} else {
			b.srv.Kill()
		}
		select {
		case <-l.Done():
		case <-time.After(20 * time.Second):
			t.Fatal("the lease outlived its TTL with Redis gone")
		}
		for what, cause := range map[string]error{"Err": l.Err(), "Context's cause": context.Cause(l.Context())} {
			assert.ErrorIs(t, cause, ErrLeaseExpired, what)
			assert.ErrorIs(t, cause, syscall.ECONNREFUSED, "%s: %v", what, cause)
			assert.ErrorContains(t, cause, "refresh", what)
		}
	})
}

// A Release that fails ends the lease on this side, and its cause says the
// release failed, carrying that error, not "already released"; a later
// Release that succeeds says so.
func TestLease_Err_afterAFailedReleaseSaysSo(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		var down atomic.Bool
		hp := &hookPool{Pool: b.pool, BeforeDo: func(cmd string, args []interface{}) error {
			if isScript(engine.Release.Script, cmd, args) && down.Load() {
				return errLink
			}
			return nil
		}}
		s := warmSemaphore(t, hp, "release-fails")
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		down.Store(true)
		require.ErrorIs(t, l.Release(ctx), errLink)
		assert.False(t, l.Valid())
		for what, cause := range map[string]error{"Err": l.Err(), "Context's cause": context.Cause(l.Context())} {
			assert.ErrorIs(t, cause, errLink, what)
			assert.False(t, errors.Is(cause, ErrReleased), "%s: %v", what, cause)
			assert.ErrorContains(t, cause, "Release failed", what)
		}
		down.Store(false)
		require.NoError(t, l.Release(ctx))
		assert.ErrorIs(t, l.Err(), ErrReleased, "a later Release succeeded")
		requireInventory(t, s, 1, 0)
	})
}
