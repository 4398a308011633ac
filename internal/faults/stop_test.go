package faults

import (
	"context"
	"math/rand/v2"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// lastAcq returns pid's latest acq event, if any.
func lastAcq(r *run, pid int) (history.Event, bool) {
	evs, _, _ := history.Read(r.hist)
	var last history.Event
	ok := false
	for _, e := range evs {
		if e.Pid == pid && e.K == history.KAcq {
			last, ok = e, true
		}
	}
	return last, ok
}

// Fault 2: a holder frozen (SIGSTOP) past its lease TTL, then resumed
// (SIGCONT). Meanwhile its token is reclaimed and reused; once resumed the
// holder finds its lease over (Done closed, Err set, Valid false), Release
// returns ErrLeaseLost, and no duplicate token appears.
func TestStoppedHolderPastTTL(t *testing.T) {
	t.Parallel()
	const n = 2
	const ttl = 500 * time.Millisecond
	srv := redistest.Start(t)
	r := newRun(t, srv, n, ttl, 200*time.Millisecond)
	rounds := 3
	if soak() {
		rounds = 20
	}
	var victims []*proc
	for i := 0; i < rounds; i++ {
		v := r.spawn("-iters", "1", "-holdmin", (3 * ttl).String(), "-holdmax", (3 * ttl).String())
		require.True(t, waitFor(10*time.Second, func() bool { _, ok := lastAcq(r, v.pid()); return ok }), "victim never acquired")
		require.NoError(t, syscall.Kill(v.pid(), syscall.SIGSTOP))
		stoppedAt := time.Now()
		// Workers that reuse the victim's token, started for this round:
		// workers started once, for a time fixed in advance, could stop
		// before the last round on a loaded machine, where the rounds take
		// longer (the waits above allow 10s each), and nobody would reuse
		// that victim's token.
		for j := 0; j < 3; j++ {
			r.spawn("-dur", (4*ttl + 2*time.Second).String(), "-holdmin", "10ms", "-holdmax", "60ms")
		}
		acq, _ := lastAcq(r, v.pid())
		// Wait until another worker has acquired the victim's token.
		reused := waitFor(10*time.Second, func() bool {
			evs, _, _ := history.Read(r.hist)
			return count(evs, history.KAcq, func(e history.Event) bool {
				return e.Pid != v.pid() && e.Tok == acq.Tok && e.T > acq.T
			}) > 0
		})
		assert.True(t, reused, "the stopped holder's token was not reused")
		if d := 4*ttl - time.Since(stoppedAt); d > 0 {
			time.Sleep(d)
		}
		require.NoError(t, syscall.Kill(v.pid(), syscall.SIGCONT))
		assert.True(t, v.wait(10*time.Second), "victim did not finish after SIGCONT")
		victims = append(victims, v)
	}
	r.waitAll(30 * time.Second)
	evs := r.events()
	for _, v := range victims {
		var rev, rel *history.Event
		for i, e := range evs {
			if e.Pid != v.pid() {
				continue
			}
			switch e.K {
			case history.KRevived:
				rev = &evs[i]
			case history.KRel:
				rel = &evs[i]
			}
		}
		if assert.NotNil(t, rev, "victim %d did not report its lease on resume", v.id) {
			assert.False(t, rev.Valid, "resumed holder's lease still Valid")
			assert.True(t, rev.Done, "resumed holder's Done not closed")
			assert.Contains(t, []string{"expired", "lost"}, rev.Class, "Lease.Err after resume: %s", rev.Err)
		}
		if assert.NotNil(t, rel, "victim %d did not release", v.id) {
			assert.Equal(t, "lost", rel.Class, "Release after resume: %s", rel.Err)
		}
	}
	rep := r.check(history.Options{})
	st, lost, _ := quiesce(t, r.ops(), r.sem(), 5*time.Second)
	t.Logf("SIGSTOP holder past TTL: clients=%d stops=%d %s; tokens lost=%d stray=%d rejected=%d",
		len(r.procs), len(victims), rep.Summary(), lost, st.Stray, st.Rejected)
}

// Fault 6b: a waiter frozen (SIGSTOP) while first in line. Redis hands it the
// next token and the pipelined lease script records its lease, so the token
// comes back by lease expiry (within the TTL) to the next waiter; the frozen
// waiter, once resumed, must not use the stale grant.
func TestFrozenWaiterFirstInLine(t *testing.T) {
	t.Parallel()
	// Every waiter's block ends by the earliest lease deadline, the
	// holder's (auto-refreshed, at least two thirds of a TTL ahead): the
	// frozen waiter must still be blocked when the second one blocks and
	// when the holder releases. So the second waiter is a goroutine of
	// this test, blocked within milliseconds, not a process whose start
	// may take seconds on a loaded machine.
	const ttl = 3 * time.Second
	srv := redistest.Start(t)
	r := newRun(t, srv, 1, ttl, 200*time.Millisecond)
	sem := r.sem(redsem.WithAutoRefresh())
	second := r.sem() // its own connections: another client
	admin := srv.Pool(t).Get()
	defer admin.Close()
	blocked := func() int {
		n := 0
		for _, c := range clientList(t, admin) {
			if c["cmd"] == "blmove" {
				n++
			}
		}
		return n
	}
	rounds := 2
	if soak() {
		rounds = 10
	}
	for round := 0; round < rounds; round++ {
		holder, err := sem.Acquire(ctxT(t, 5*time.Second))
		require.NoError(t, err)
		w := r.spawn("-iters", "1", "-holdmin", "10ms", "-holdmax", "10ms")
		require.True(t, waitFor(20*time.Second, func() bool { return blocked() == 1 }), "frozen-to-be waiter never blocked")
		require.NoError(t, syscall.Kill(w.pid(), syscall.SIGSTOP))
		type result struct {
			l   *redsem.Lease
			err error
		}
		got := make(chan result, 1)
		go func() {
			l, err := second.Acquire(ctxT(t, 30*time.Second))
			got <- result{l, err}
		}()
		if !waitFor(20*time.Second, func() bool { return blocked() == 2 }) {
			t.Fatalf("second waiter never blocked: the holder is valid %v (%v), %d blocked", holder.Valid(), holder.Err(), blocked())
		}
		require.NoError(t, holder.Release(ctxT(t, 5*time.Second)))
		released := time.Now()
		// Redis served the frozen waiter: its lease is recorded.
		require.True(t, waitFor(10*time.Second, func() bool {
			st, err := r.ops().Status(context.Background())
			return err == nil && len(st.Holders) == 1
		}), "no lease recorded for the frozen waiter")
		// The second waiter gets the token once that lease expires, while
		// the frozen waiter is still frozen.
		var x result
		select {
		case x = <-got:
		case <-time.After(ttl + 30*time.Second):
			t.Fatal("second waiter never got the token")
		}
		require.NoError(t, x.err)
		t.Logf("round %d: the token handed to the frozen waiter reached the next waiter %v after the release (TTL %v)",
			round, time.Since(released).Round(time.Millisecond), ttl)
		xFence := x.l.Fence()
		require.NoError(t, x.l.Release(ctxT(t, 5*time.Second)))
		require.NoError(t, syscall.Kill(w.pid(), syscall.SIGCONT))
		assert.True(t, w.wait(30*time.Second), "resumed waiter did not finish")
		wa, ok := lastAcq(r, w.pid())
		if assert.True(t, ok, "resumed waiter never acquired") {
			assert.Greater(t, wa.Fence, xFence, "the resumed waiter used the stale grant")
		}
	}
	r.waitAll(20 * time.Second)
	rep := r.check(history.Options{})
	_, lost, _ := quiesce(t, r.ops(), sem, 5*time.Second)
	t.Logf("frozen first waiter: clients=%d freezes=%d %s; tokens lost=%d", len(r.procs), rounds, rep.Summary(), lost)
}

// Fault 6a: server stalls (DEBUG SLEEP) longer than the clients' read
// timeout, some also longer than the lease TTL.
func TestServerStalls(t *testing.T) {
	t.Parallel()
	const n = 2
	const ttl = time.Second
	srv := redistest.Start(t)
	r := newRun(t, srv, n, ttl, 200*time.Millisecond, "-rto", "700ms")
	runFor := scaled(6*time.Second, 10)
	for i := 0; i < 5; i++ {
		r.spawn("-dur", runFor.String(), "-holdmin", "10ms", "-holdmax", "80ms")
	}
	admin, err := redis.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	defer admin.Close()
	stalls := map[string]int{}
	end := time.Now().Add(runFor - time.Second)
	for i := 0; time.Now().Before(end) && i < 1000; i++ {
		time.Sleep(time.Duration(300+rand.IntN(400)) * time.Millisecond)
		d := []time.Duration{900 * time.Millisecond, 1500 * time.Millisecond}[i%2]
		_, err := admin.Do("DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
		require.NoError(t, err)
		stalls[d.String()]++
	}
	r.waitAll(40 * time.Second)
	rep := r.check(history.Options{})
	_, lost, _ := quiesce(t, r.ops(), r.sem(), 15*time.Second)
	t.Logf("server stalls: clients=%d stalls=%v (read timeout 700ms, TTL %v) %s; tokens lost=%d", len(r.procs), stalls, ttl, rep.Summary(), lost)
	assert.Positive(t, rep.Holds)
}
