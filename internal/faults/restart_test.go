package faults

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// Fault 5a: redis-server killed (-9) and restarted with appendonly yes and
// appendfsync always: the state survives and the invariants hold across.
func TestRestartWithAOF(t *testing.T) {
	t.Parallel()
	const n = 3
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	r := newRun(t, srv, n, time.Second, 300*time.Millisecond)
	runFor := scaled(6*time.Second, 10)
	for i := 0; i < 5; i++ {
		r.spawn("-dur", runFor.String(), "-holdmin", "10ms", "-holdmax", "100ms")
	}
	sem := r.sem()
	restarts := 0
	var epochs []string
	for i := 0; i < 2; i++ {
		time.Sleep(runFor / 3)
		epochs = append(epochs, status(t, r.ops()).Epoch)
		srv.Restart()
		restarts++
	}
	r.waitAll(40 * time.Second)
	rep := r.check(history.Options{})
	st, lost, _ := quiesce(t, r.ops(), sem, 15*time.Second)
	epochs = append(epochs, st.Epoch)
	for _, e := range epochs {
		assert.Equal(t, epochs[0], e, "the semaphore was re-created although AOF kept it")
	}
	t.Logf("restart with AOF (appendfsync always, kill -9): clients=%d restarts=%d %s; tokens lost=%d", len(r.procs), restarts, rep.Summary(), lost)
	assert.Equal(t, 1, rep.Epochs)
}

// Fault 5b: redis-server restarted with no persistence: the semaphore comes
// back at N tokens on the next use with a new epoch, leases from before the
// restart are reported lost, and their releases add no token.
func TestRestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	const n = 2
	const ttl = 2 * time.Second
	srv := redistest.Start(t)
	r := newRun(t, srv, n, ttl, 300*time.Millisecond)
	sem := r.sem()
	old, err := sem.Acquire(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	st0, err := r.ops().Status(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	runFor := scaled(5*time.Second, 10)
	for i := 0; i < 3; i++ {
		r.spawn("-dur", runFor.String(), "-holdmin", "10ms", "-holdmax", "100ms")
	}
	time.Sleep(runFor / 3)
	srv.Restart()
	restarted := time.Now()

	// The next use re-creates it with a new epoch.
	var st admin.Status
	require.True(t, waitFor(10*time.Second, func() bool {
		st, err = r.ops().Status(context.Background())
		return err == nil && st.Exists
	}), "the semaphore did not come back")
	assert.NotEqual(t, st0.Epoch, st.Epoch, "no new epoch after the data was lost")
	assert.Equal(t, n, st.Size)
	assert.Equal(t, n, st.Available+len(st.Holders), "tokens after re-creation: %+v", st)

	// The lease from before the restart is lost, and releasing it adds
	// nothing.
	err = old.Release(ctxT(t, 5*time.Second))
	assert.True(t, errors.Is(err, redsem.ErrLeaseLost), "Release of a pre-restart lease: %v", err)
	after, err := r.ops().Status(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	assert.Zero(t, after.Stray, "the old release pushed a token")
	assert.LessOrEqual(t, after.Available+len(after.Holders), n)

	// A forged release of an old-epoch token (as a pre-restart client with a
	// bug would do) is dropped, not counted.
	k := history.KeysFor("redsem:", r.name)
	srv.Do(t, "LPUSH", k.Tokens, old.Token())

	r.waitAll(40 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{PerEpoch: true, AllowUnleased: true})
	final, lost, _ := quiesce(t, r.ops(), sem, 15*time.Second)
	lostRel := count(evs, history.KRel, func(e history.Event) bool { return e.Class == "lost" })
	t.Logf("restart without persistence: clients=%d restarts=1 (%v ago) %s; pre-restart releases reported lost=%d (+1 by the test); tokens lost=%d rejected=%d",
		len(r.procs), time.Since(restarted).Round(time.Millisecond), rep.Summary(), lostRel, lost, final.Rejected)
	t.Logf("note: max overlap across the restart (old-epoch leases still believed + new epoch) = %d for N=%d; fences still increase", rep.CrossEpochOverlap, n)
	assert.Equal(t, 2, rep.Epochs, "holds should span two epochs")
	assert.Positive(t, final.Rejected, "the old-epoch token pushed by hand was not rejected")
}
