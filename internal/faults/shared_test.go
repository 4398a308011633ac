package faults

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// Shared waiting under faults: each worker process runs several goroutines
// on one *Semaphore, so most of them wait in the process's local queue
// behind one (or two) blocking calls, and every goroutine records its own
// holds (holder = pid and goroutine index).

// libConns lists the library's connections on the server (not the workers'
// bookkeeping connections, named "hist", nor the test's, named "admin"):
// those blocked in Redis, and the others.
func libConns(t *testing.T, admin redis.Conn) (blocked, other []map[string]string) {
	for _, c := range clientList(t, admin) {
		if c["name"] == "hist" || c["name"] == "admin" || c["id"] == "" {
			continue
		}
		if c["cmd"] == "blmove" || c["cmd"] == "blpop" || strings.Contains(c["flags"], "b") {
			blocked = append(blocked, c)
		} else {
			other = append(other, c)
		}
	}
	return blocked, other
}

// adminConn is a connection of the test's own, named "admin".
func adminConn(t *testing.T, srv *redistest.Server) redis.Conn {
	c, err := redis.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = c.Do("CLIENT", "SETNAME", "admin")
	require.NoError(t, err)
	return c
}

// holdsBy counts the holds of each goroutine 0..g-1 of pid.
func holdsBy(evs []history.Event, pid, g int) []int {
	n := make([]int, g)
	for _, e := range evs {
		if e.K == history.KAcq && e.Pid == pid && e.G >= 0 && e.G < g {
			n[e.G]++
		}
	}
	return n
}

// servedGoroutines checks that every goroutine of every worker the test left
// alone (not killed, not stopped, not dead at the strand failpoint) that ran
// at least minLife got a hold, and returns how many goroutines were checked
// and how many were served.
func servedGoroutines(t *testing.T, evs []history.Event, ps []*proc, skip map[*proc]bool, g int, end time.Time, minLife time.Duration) (checked, ok int) {
	t.Helper()
	for _, p := range ps {
		if p.killed || skip[p] || end.Sub(p.start) < minLife ||
			count(evs, history.KFPKill, func(e history.Event) bool { return e.Pid == p.pid() }) > 0 {
			continue
		}
		for i, n := range holdsBy(evs, p.pid(), g) {
			checked++
			if n > 0 {
				ok++
			} else {
				t.Errorf("worker %d (pid %d, ran %v) goroutine %d never held a token", p.id, p.pid(), end.Sub(p.start).Round(time.Millisecond), i)
			}
		}
	}
	return checked, ok
}

// Shared waiting under kill -9 of random worker processes and CLIENT KILL of
// their connections (pumps blocked in BLMOVE, holders' and idle ones).
func TestSharedWaitingKillAndClientKill(t *testing.T) {
	t.Parallel()
	const n, procs, gor = 3, 4, 8
	srv := redistest.Start(t)
	r := newRun(t, srv, n, 800*time.Millisecond, 300*time.Millisecond, "-histname",
		"-goroutines", strconv.Itoa(gor), "-acqtimeout", "8s")
	runFor := scaled(6*time.Second, 10)
	end := time.Now().Add(runFor)
	spawn := func(i int) *proc {
		args := []string{"-dur", time.Until(end).Round(time.Millisecond).String(),
			"-holdmin", "5ms", "-holdmax", "40ms", "-gapmax", "10ms"}
		if i%2 == 1 {
			args = append(args, "-waitconns", "2")
		}
		if i%3 == 2 {
			// a pump that dies between its BLMOVE and the lease script
			args = append(args, "-strandp", "0.05")
		}
		return r.spawn(args...)
	}
	// Worker 0 (no strand failpoint) is never a kill -9 victim, so at least
	// one worker is left alone long enough to check its goroutines are served.
	spawn(0)
	live := map[*proc]bool{}
	for i := 1; i < procs; i++ {
		live[spawn(i)] = true
	}
	admin := adminConn(t, srv)
	kills := map[string]int{}
	for i := 0; time.Now().Before(end.Add(-time.Second)) && i < 10000; i++ {
		time.Sleep(time.Duration(100+rand.IntN(250)) * time.Millisecond)
		for p := range live {
			if p.exited() {
				delete(live, p)
				live[spawn(i)] = true
			}
		}
		if i%4 == 3 {
			for p := range live { // random victim, never worker 0
				p.kill9()
				kills["kill -9"]++
				delete(live, p)
				live[spawn(i)] = true
				break
			}
			continue
		}
		blocked, other := libConns(t, admin)
		kind, cs := "blocked pump", blocked
		if i%4 == 1 {
			kind, cs = "holder or idle", other
		}
		if len(cs) == 0 {
			continue
		}
		c := cs[rand.IntN(len(cs))]
		if _, err := admin.Do("CLIENT", "KILL", "ID", c["id"]); err == nil {
			kills["CLIENT KILL "+kind]++
		}
	}
	r.waitAll(40 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{})
	st, lost, took := quiesce(t, r.ops(), r.sem(), 15*time.Second)
	assert.Empty(t, pendKeys(t, srv, history.KeysFor("redsem:", r.name)), "pending lists left")
	checked, served := servedGoroutines(t, evs, r.procs, nil, gor, end, 3*time.Second)
	t.Logf("shared waiting, kill -9 and CLIENT KILL: clients=%d processes x %d goroutines (%d holders) faults=%v failpoint self-kills=%d %s; max overlap %d of N=%d; goroutines served %d/%d; quiesced in %v, tokens lost=%d, rejected=%d",
		len(r.procs), gor, rep.Holders, kills, rep.FPKills, rep.Summary(), rep.MaxOverlap, n, served, checked, took.Round(time.Millisecond), lost, st.Rejected)
	assert.Zero(t, lost, "tokens lost")
	assert.Positive(t, kills["kill -9"], "no process was killed")
	assert.Positive(t, kills["CLIENT KILL blocked pump"], "no blocked pump was killed")
	assert.Positive(t, checked, "no worker was left alone long enough to check that its goroutines were served")
	assert.Greater(t, rep.MaxHolds, 1)
}

// A cancellation storm with shared waiting: in every process most goroutines
// cancel their Acquires on purpose (leaving the local queue with no round
// trip, or settling the pump's wait when the last one leaves), next to
// goroutines of the same processes that never cancel and must not starve.
func TestSharedWaitingCancellationStorm(t *testing.T) {
	t.Parallel()
	const n, procs, gor, steady = 2, 4, 8, 2
	srv := redistest.Start(t)
	r := newRun(t, srv, n, time.Second, 300*time.Millisecond, "-goroutines", strconv.Itoa(gor))
	runFor := scaled(5*time.Second, 10)
	end := time.Now().Add(runFor)
	for i := 0; i < procs; i++ {
		args := []string{"-dur", runFor.String(), "-storm", "-stormmax", "40ms", "-steady", strconv.Itoa(steady),
			"-acqtimeout", "10s", "-holdmin", "5ms", "-holdmax", "30ms", "-gapmax", "2ms"}
		if i%2 == 1 {
			// two pumps (see TestIdlePumpStopsWhenQueueEmptiedByGrant)
			args = append(args, "-waitconns", "2")
		}
		r.spawn(args...)
	}
	r.waitAll(40 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{})
	sem := r.sem()
	st, lost, _ := quiesce(t, r.ops(), sem, 15*time.Second)
	// A process that exited while its pump was registered leaves that
	// registration until its sweep: the wait's block time plus the grace at
	// most (the documented bound), then nothing may be left.
	deadline := time.Now().Add(redsem.DefaultGrace + 32*time.Second)
	for st.Waiting > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		st, _, _ = settle(t, r.ops(), sem, time.Second)
	}
	assert.Zero(t, st.Waiting, "waiters still registered after the storm, past block time plus grace")
	assert.Empty(t, pendKeys(t, srv, history.KeysFor("redsem:", r.name)), "pending lists left")
	steadyHolds, steadyMin := 0, -1
	for _, p := range r.procs {
		for _, c := range holdsBy(evs, p.pid(), steady) {
			steadyHolds += c
			if steadyMin < 0 || c < steadyMin {
				steadyMin = c
			}
		}
	}
	checked, served := servedGoroutines(t, evs, r.procs, nil, gor, end, 0)
	var maxLag int64
	for _, e := range evs {
		if e.K == history.KCancel && e.Lag > maxLag {
			maxLag = e.Lag
		}
	}
	t.Logf("shared waiting, cancellation storm: clients=%d processes x %d goroutines (%d storming, %d steady each; %d holders) cancels=%d (slowest return after the context ended %v) %s; max overlap %d of N=%d; steady holds=%d (least per goroutine %d); goroutines served %d/%d; waiting=%d, tokens lost=%d",
		len(r.procs), gor, gor-steady, steady, rep.Holders, rep.Cancels, time.Duration(maxLag)*time.Microsecond, rep.Summary(), rep.MaxOverlap, n, steadyHolds, steadyMin, served, checked, st.Waiting, lost)
	assert.Zero(t, lost, "tokens lost")
	assert.Greater(t, rep.Cancels, 100, "the storm cancelled too few Acquires")
	assert.Positive(t, steadyMin, "a steady goroutine starved")
}

// Regression (found by TestSharedWaitingCancellationStorm with
// -waitconns 2, fixed in tokens.go (then acquire.go) by "Serving the last local waiter stops the
// other pumps"): with WithWaitConnections(n >= 2), when the local queue
// emptied because its last waiter was served (not cancelled), the other
// pumps stayed blocked in BLMOVE, registered as waiting, keeping a place in
// Redis's queue ahead of other clients' waiters.
//
// Deterministic: one token, held by another client; two goroutines of a
// WithWaitConnections(2) semaphore wait (two pumps blocked), then a waiter of
// another client. Tokens go pump 1 -> goroutine 1 (pump 1 blocks again,
// behind the other client's waiter), pump 2 -> goroutine 2 (the queue is now
// empty), then the other client. Nobody of the first semaphore waits, so
// none of its pumps may stay blocked in Redis.
func TestIdlePumpStopsWhenQueueEmptiedByGrant(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRun(t, srv, 1, 10*time.Second, 300*time.Millisecond)
	shared := r.sem(redsem.WithWaitConnections(2))
	other := r.sem()
	admin := adminConn(t, srv)
	blocked := func() int { b, _ := libConns(t, admin); return len(b) }

	h, err := other.Acquire(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	leases := make(chan *redsem.Lease, 3)
	acquire := func(s *redsem.Semaphore) {
		l, err := s.Acquire(ctxT(t, 20*time.Second))
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		leases <- l
	}
	go acquire(shared)
	go acquire(shared)
	require.True(t, waitFor(5*time.Second, func() bool { return blocked() == 2 }), "the two pumps never blocked")
	go acquire(other)
	require.True(t, waitFor(5*time.Second, func() bool { return blocked() == 3 }), "the other client's waiter never blocked")

	require.NoError(t, h.Release(ctxT(t, 5*time.Second)))
	for i := 0; i < 2; i++ { // the two goroutines of shared, one after the other
		l := <-leases
		require.NotNil(t, l)
		require.NoError(t, l.Release(ctxT(t, 5*time.Second)))
	}
	x := <-leases // the other client's waiter
	require.NotNil(t, x)
	defer func() { _ = x.Release(context.Background()) }()

	// Nobody waits now, in either client.
	idle := waitFor(2*time.Second, func() bool { return blocked() == 0 })
	// The stopped pump settles its registration on a fresh connection: give
	// that the same bounded wait.
	st := status(t, r.ops())
	waitFor(2*time.Second, func() bool { st = status(t, r.ops()); return st.Waiting == 0 })
	t.Logf("after the queue emptied by a grant: blocked connections=%d, Status.Waiting=%d", blocked(), st.Waiting)
	assert.True(t, idle, "a pump of the shared semaphore is still blocked in Redis with no goroutine waiting")
	assert.Zero(t, st.Waiting, "a wait is still registered with no goroutine waiting")
}
