package redsem

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// warmSemaphore returns a semaphore of size 1 on p whose scripts are loaded
// (EVALSHA works from the first call on).
func warmSemaphore(t *testing.T, p Pool, name string) *Semaphore {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	s, err := NewSemaphore(p, name, 1, WithFixedTTL(), WithTTL(time.Minute))
	require.NoError(t, err)
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	return s
}

// The first run of a Release took effect but its reply was lost; its retry
// gets an error reply (here READONLY: the node was demoted meanwhile).
// Redis gave the token back, so the lease must not stay Valid.
func TestLease_Release_retriedIntoAnErrorReplyEndsTheLease(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 20*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var lose atomic.Bool
	hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
		if isScript(engine.Release.Script, cmd, args) && lose.Swap(false) {
			b.do(t, "REPLICAOF", "127.0.0.1", strconv.Itoa(nobody))
			return errLostReply
		}
		return nil
	}}
	s := warmSemaphore(t, hp, "demoted-mid-release")
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	lose.Store(true)
	require.ErrorContains(t, l.Release(ctx), "READONLY")
	b.do(t, "REPLICAOF", "NO", "ONE")

	l2, err := newSem(t, b, "demoted-mid-release", 1).TryAcquire(ctx)
	require.NoError(t, err, "the first attempt gave the token back")
	assert.False(t, l.Valid(), "the first holder must not believe it holds the token another holds")
	require.NoError(t, l2.Release(ctx))
}

// A retried Release that answers "not recorded" checks the epoch; when that
// check fails, the first attempt had most likely released the lease: it
// ends.
func TestLease_Release_whoseEpochCheckFailsEndsTheLease(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 20*time.Second)
	var lose, hgetDown atomic.Bool
	hp := &hookPool{Pool: b.pool,
		AfterDo: func(cmd string, args []interface{}) error {
			if isScript(engine.Release.Script, cmd, args) && lose.Swap(false) {
				return errLostReply
			}
			return nil
		},
		BeforeDo: func(cmd string, args []interface{}) error {
			if cmd == "HGET" && hgetDown.Load() {
				return errLink
			}
			return nil
		}}
	s := warmSemaphore(t, hp, "epoch-check-fails")
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	lose.Store(true)
	hgetDown.Store(true)
	require.ErrorIs(t, l.Release(ctx), errLink)
	hgetDown.Store(false)

	l2, err := newSem(t, b, "epoch-check-fails", 1).TryAcquire(ctx)
	require.NoError(t, err, "the token went back to the list")
	assert.False(t, l.Valid(), "the first holder must not believe it holds the token another holds")
	require.NoError(t, l2.Release(ctx))
}

// Once a lease has ended, Err says why and keeps saying it: a later
// Release does not rewrite it, and it agrees with the Context's cause.
func TestLease_Err_ofAnEndedLeaseStays(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		s := newSem(t, b, "err-stays", 1, WithFixedTTL(), WithTTL(200*time.Millisecond))
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		<-l.Done()
		require.ErrorIs(t, l.Err(), ErrLeaseExpired)
		_ = l.Release(ctx) // not reclaimed yet: released normally
		assert.ErrorIs(t, context.Cause(l.Context()), ErrLeaseExpired)
		assert.ErrorIs(t, l.Err(), ErrLeaseExpired)
		assert.False(t, errors.Is(l.Err(), ErrReleased))
	})
}
