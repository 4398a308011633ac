package faults

import (
	"context"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// Fault 1: kill -9 of clients at random moments, some of them at the
// failpoint between the BLMOVE that moved a token into their pending list and
// the lease script (skipped), so that the token is stranded with no lease.
func TestKill9Clients(t *testing.T) {
	t.Parallel()
	const n = 3
	srv := redistest.Start(t)
	r := newRun(t, srv, n, 800*time.Millisecond, 300*time.Millisecond)
	runFor := scaled(6*time.Second, 10)
	end := time.Now().Add(runFor)
	common := []string{"-holdmin", "5ms", "-holdmax", "60ms", "-gapmax", "10ms"}
	spawn := func(i int) *proc {
		args := append([]string{"-dur", time.Until(end).Round(time.Millisecond).String()}, common...)
		if i%3 == 0 {
			args = append(args, "-strandp", "0.2")
		}
		return r.spawn(args...)
	}
	live := map[*proc]bool{}
	for i := 0; i < 7; i++ {
		live[spawn(i)] = true
	}
	kills, respawns := 0, 0
	for i := 0; time.Now().Before(end.Add(-500*time.Millisecond)) && i < 10000; i++ {
		time.Sleep(time.Duration(50+rand.IntN(250)) * time.Millisecond)
		for p := range live {
			if p.exited() {
				delete(live, p) // finished, or killed itself at the failpoint
				live[spawn(kills+respawns)] = true
				respawns++
			}
		}
		for p := range live { // random victim
			p.kill9()
			kills++
			delete(live, p)
			live[spawn(kills+respawns)] = true
			break
		}
	}
	r.waitAll(40 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{})
	st, lost, took := quiesce(t, r.ops(), r.sem(), 15*time.Second)
	t.Logf("kill -9: clients=%d kills=%d failpoint self-kills (lease script skipped, BLMOVE returned)=%d %s; quiesced in %v, tokens lost=%d, rejected=%d",
		len(r.procs), kills, rep.FPKills, rep.Summary(), took.Round(time.Millisecond), lost, st.Rejected)
	assert.Positive(t, rep.FPKills, "no client died at the failpoint")
	assert.Positive(t, count(evs, history.KAcq, nil), "no holds")
}

// Fault 1, deterministic: a client dies after Redis moved the token into its
// pending list and before any lease was recorded. The token must come back
// within the wait's block time plus the grace, to a client that is blocked
// waiting for it.
func TestKilledBetweenMoveAndLease(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const ttl, grace = 2 * time.Second, 300 * time.Millisecond
	r := newRun(t, srv, 1, ttl, grace)
	sem := r.sem()
	k := history.KeysFor("redsem:", r.name)

	holder, err := sem.Acquire(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	w := r.spawn("-strandp", "1", "-iters", "1")
	admin := srv.Pool(t).Get()
	defer admin.Close()
	require.True(t, waitFor(5*time.Second, func() bool {
		for _, c := range clientList(t, admin) {
			if c["cmd"] == "blmove" {
				return true
			}
		}
		return false
	}), "worker never blocked in BLMOVE")
	require.NoError(t, holder.Release(ctxT(t, 5*time.Second)))
	released := time.Now()
	require.True(t, w.wait(5*time.Second), "worker did not die at the failpoint")
	require.NotNil(t, w.cmd.ProcessState)
	ws, _ := w.cmd.ProcessState.Sys().(syscall.WaitStatus)
	assert.Equal(t, syscall.SIGKILL, ws.Signal(), "worker should have killed itself")

	pend := pendKeys(t, srv, k)
	require.Len(t, pend, 1, "the token should sit in the dead worker's pending list")
	var acq, tok string
	for key, toks := range pend {
		acq, tok = strings.TrimPrefix(key, k.Base+"pend:"), toks[0]
	}
	sweepMs, err := redis.Int64(admin.Do("ZSCORE", k.Waits, "w:"+acq))
	require.NoError(t, err, "the stranded wait must be registered for sweeping")
	nowV, err := redis.Int64s(admin.Do("TIME"))
	require.NoError(t, err)
	untilSweep := time.Duration(sweepMs-(nowV[0]*1000+nowV[1]/1000)) * time.Millisecond
	st, err := r.ops().Status(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	assert.Zero(t, st.Available)
	assert.Empty(t, st.Holders)

	// A client blocked in Acquire must get the token once the sweep deadline
	// (block time + grace) has passed, without anyone calling Reclaim.
	start := time.Now()
	l, err := sem.Acquire(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	got := time.Since(start)
	t.Logf("stranded token %s in pend:%s; sweepable in %v; a blocked Acquire got it after %v (%v after the release)",
		tok, acq, untilSweep.Round(time.Millisecond), got.Round(time.Millisecond), time.Since(released).Round(time.Millisecond))
	assert.Equal(t, tok, l.Token())
	assert.LessOrEqual(t, got, untilSweep+time.Second, "stranded token came back late: a waiter blocks past the sweep deadline of a stranded pending list")
	require.NoError(t, l.Release(context.Background()))
	quiesce(t, r.ops(), sem, 5*time.Second)
}
