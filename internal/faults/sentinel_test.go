package faults

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/sentinel"
)

// newSentinelRun is newRun for workers that find the master through the
// sentinels of set. It returns the run and a semaphore on it for the test's
// own use, through a sentinel.Pool of its own.
func newSentinelRun(t *testing.T, set *redistest.Sentinels, size int, ttl, grace time.Duration, extra ...string) (*run, *redsem.Semaphore) {
	r := &run{t: t, hist: filepath.Join(t.TempDir(), "history.jsonl"), name: "faults-" + t.Name(),
		size: size, ttl: ttl, grace: grace}
	r.base = append([]string{"-sentinels", strings.Join(set.Addrs(), ","), "-master", redistest.SentinelName,
		"-hist", r.hist, "-name", r.name, "-size", strconv.Itoa(size),
		"-ttl", ttl.String(), "-grace", grace.String()}, extra...)
	t.Cleanup(r.stopAll)
	p, err := sentinel.New(ctxT(t, 20*time.Second), set.Addrs(), redistest.SentinelName)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	sem, err := redsem.NewSemaphore(p, r.name, size, redsem.WithTTL(ttl), redsem.WithFixedTTL(), redsem.WithGrace(grace))
	require.NoError(t, err)
	r.adm, err = admin.New(p, redsem.DefaultPrefix, r.name)
	require.NoError(t, err)
	return r, sem
}

// acquiredAfter reports the workers (by pid) with no grant at or after t
// (µs of Redis TIME, which on loopback is this machine's clock).
func acquiredAfter(r *run, evs []history.Event, t int64) []int {
	got := map[int]bool{}
	for _, e := range evs {
		if e.K == history.KAcq && e.T >= t {
			got[e.Pid] = true
		}
	}
	var missing []int
	for _, p := range r.procs {
		if !p.killed && !got[p.pid()] {
			missing = append(missing, p.pid())
		}
	}
	return missing
}

// stopOnceGranted lets the workers of r (spawned with "-stopfile") run
// until each has a grant at or after since (µs of Redis TIME) and until
// notBefore, at most ceiling from now, then stops them. A failover takes as
// long as the machine's load makes it: the workers wait for it rather than
// run out first.
func stopOnceGranted(r *run, since int64, notBefore time.Time, ceiling time.Duration) {
	waitFor(ceiling, func() bool {
		evs, _, err := history.Read(r.hist)
		return err == nil && len(acquiredAfter(r, evs, since)) == 0 && !time.Now().Before(notBefore)
	})
	r.stop()
}

// blockedOn counts the clients blocked in BLMOVE on srv.
func blockedOn(t *testing.T, set *redistest.Sentinels, srv *redistest.Server) int {
	v, err := redis.String(set.Do(srv, "CLIENT", "LIST"))
	require.NoError(t, err)
	return strings.Count(v, "cmd=blmove")
}

// Sentinel 1: SENTINEL FAILOVER under load from worker processes that
// find the master through the sentinels. Every worker follows the new
// master, the checker finds at most N holders, no token held twice, fences
// in order, and no token is lost.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	const n = 2
	set := redistest.StartSentinels(t, redistest.SentinelOptions{})
	r, sem := newSentinelRun(t, set, n, 2*time.Second, 300*time.Millisecond)
	runFor := scaled(8*time.Second, 5)
	begin := time.Now()
	for i := 0; i < 5; i++ {
		r.spawn("-dur", (runFor + failoverCeiling).String(), "-stopfile", r.stopFile(), "-holdmin", "5ms", "-holdmax", "40ms")
	}
	time.Sleep(runFor / 4)
	old := set.Master()
	blocked := 0
	waitFor(30*time.Second, func() bool { blocked = blockedOn(t, set, old); return blocked > 0 })
	start := time.Now()
	m, took, err := set.Failover(failoverCeiling)
	require.NoError(t, err)
	switched := start.Add(took).UnixMicro()
	stopOnceGranted(r, switched, begin.Add(runFor), failoverCeiling)
	r.waitAll(40 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{})
	st, lost, _ := quiesce(t, r.ops(), sem, time.Minute)
	t.Logf("SENTINEL FAILOVER under load: %s -> %s in %v, %d waiters were blocked on the old master; clients=%d %s; tokens lost=%d rejected=%d",
		old.Addr, m.Addr, took.Round(time.Millisecond), blocked, len(r.procs), rep.Summary(), lost, st.Rejected)
	assert.Positive(t, blocked, "no waiter was blocked on the old master")
	assert.Empty(t, acquiredAfter(r, evs, switched), "workers with no grant after the failover")
	assert.Zero(t, lost)
}

// Sentinel 2: kill -9 of the master under load, with replication cut just
// before (the replicas stopped and their links killed, so that the master's
// last writes reach no replica, as when it fails under a burst). In that
// window the test itself acquires a token and holds it across the
// failover, recording its hold in the history like a worker.
//
// Without WAIT the grant is lost with the master: the new master hands the
// same token to a worker while the test still holds it, the checker reports
// it (token, and more than N holders), and the test's Release says
// ErrLeaseLost. With WAIT 1 the Acquire fails with ErrNotReplicated instead
// of returning a lease no replica has, and the checker finds nothing. In
// both, the waiters blocked on the old master settle and wait again on the
// new one, every worker gets grants there, and no token is lost.
func TestSentinelKillMaster(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wait bool
	}{{"NoWait", false}, {"Wait", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n = 2
			const ttl = 2 * time.Second
			set := redistest.StartSentinels(t, redistest.SentinelOptions{})
			var extra []string
			var popts []sentinel.Option
			if tc.wait {
				extra = []string{"-wait", "1", "-waittimeout", "200ms"}
				popts = append(popts, sentinel.WithWait(1, 200*time.Millisecond))
			}
			r, sem := newSentinelRun(t, set, n, ttl, 300*time.Millisecond, extra...)
			mine := testHolder(t, set, r, popts...)
			runFor := scaled(10*time.Second, 5)
			begin := time.Now()
			for i := 0; i < 5; i++ {
				r.spawn("-dur", (runFor + failoverCeiling).String(), "-stopfile", r.stopFile(), "-holdmin", "5ms", "-holdmax", "40ms")
			}
			time.Sleep(runFor / 5)
			old := set.Master()
			blocked := 0
			waitFor(30*time.Second, func() bool { blocked = blockedOn(t, set, old); return blocked > 0 })

			// Cut replication: stop the replicas and kill their links (the
			// master's writes from now on reach no one), acquire, kill the
			// master, resume the replicas.
			for _, s := range set.Data[1:] {
				require.NoError(t, s.Signal(syscall.SIGSTOP))
			}
			_, err := set.Do(old, "CLIENT", "KILL", "TYPE", "replica")
			require.NoError(t, err)
			cut := time.Now().UnixMicro()
			time.Sleep(100 * time.Millisecond)
			l, acqErr := mine.acquire(old)
			time.Sleep(100 * time.Millisecond)
			old.Kill()
			killed := time.Now()
			for _, s := range set.Data[1:] {
				require.NoError(t, s.Signal(syscall.SIGCONT))
			}
			m, err := set.WaitNewMaster(old, failoverCeiling)
			require.NoError(t, err)
			took := time.Since(killed)
			switched := time.Now().UnixMicro()
			var relErr error
			regranted := false
			if l != nil {
				// Hold on until the new master has given the token to a
				// worker (its stale lease there, if any, expires first),
				regranted = waitFor(failoverCeiling, func() bool {
					_, err := redis.Int64(set.Do(m, "ZSCORE", mine.k.Leases, l.Token()))
					return err == nil
				})
				// and to more of them (each holds it a few ms) while the
				// test still believes it holds it.
				time.Sleep(1500 * time.Millisecond)
				relErr = mine.release(l)
			}

			stopOnceGranted(r, switched, begin.Add(runFor), failoverCeiling)
			r.waitAll(40 * time.Second)
			evs := r.events()
			rep := history.Check(evs, history.Options{N: n})
			inWindow := count(evs, history.KAcq, func(e history.Event) bool { return e.T >= cut && e.T < killed.UnixMicro() })
			st, lost, _ := quiesce(t, r.ops(), sem, time.Minute)
			t.Logf("kill -9 of the master (WAIT=%v): new master %s %v after the kill; %d waiters were blocked on the old one; grants after replication was cut=%d (the test's: %v); clients=%d %s; tokens lost after quiescence=%d rejected=%d",
				tc.wait, m.Addr, took.Round(time.Millisecond), blocked, inWindow, acqErr, len(r.procs), rep.Summary(), lost, st.Rejected)
			for i, v := range rep.Violations {
				if i < 3 {
					t.Logf("checker: %s", v)
				}
			}
			assert.Positive(t, blocked, "no waiter was blocked on the old master")
			assert.Empty(t, acquiredAfter(r, evs, switched), "workers with no grant after the failover")
			assert.Zero(t, lost, "tokens missing after quiescence")
			if tc.wait {
				// It fails on WAIT, or waits in vain behind tokens whose
				// grants failed on WAIT and stay leased until their TTL.
				assert.Nil(t, l, "an Acquire no replica acknowledged returned a lease")
				assert.True(t, errors.Is(acqErr, sentinel.ErrNotReplicated) || errors.Is(acqErr, context.DeadlineExceeded), "%v", acqErr)
				assert.Empty(t, rep.Violations, "with WAIT the checker must find nothing")
			} else {
				require.NoError(t, acqErr)
				assert.True(t, regranted, "the new master never granted the lost token again")
				assert.ErrorIs(t, relErr, redsem.ErrLeaseLost, "the grant lost with the master")
				assert.Positive(t, rep.Kinds["token"], "the checker did not see the lost grant's token handed out again: %v", rep.Kinds)
			}
		})
	}
}

// holder is the test's own client in a fault run: it acquires through a
// sentinel.Pool of its own (lease TTL holderTTL) and records its hold in the
// run's history as a worker would (pid of the test, goroutine 0).
type holder struct {
	t   *testing.T
	set *redistest.Sentinels
	sem *redsem.Semaphore
	hw  *history.Writer
	k   history.Keys
}

// holderTTL is the TTL of the test's own lease: long enough to outlive the
// failover and the workers' stale leases on the new master, however long
// the load makes them (failoverCeiling).
const holderTTL = 3 * time.Minute

// failoverCeiling bounds each wait for a failover's outcome: a new master,
// the lost token granted again, every worker granted after the switch. A
// failover takes a few seconds on a quiet machine and has taken 13 s on a
// loaded one; a wait ends as soon as its state is reached.
const failoverCeiling = 90 * time.Second

func testHolder(t *testing.T, set *redistest.Sentinels, r *run, opts ...sentinel.Option) *holder {
	p, err := sentinel.New(ctxT(t, 20*time.Second), set.Addrs(), redistest.SentinelName, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	sem, err := redsem.NewSemaphore(p, r.name, r.size, redsem.WithTTL(holderTTL), redsem.WithFixedTTL(), redsem.WithGrace(r.grace))
	require.NoError(t, err)
	hw, err := history.Open(r.hist)
	require.NoError(t, err)
	t.Cleanup(func() { hw.Close() })
	return &holder{t: t, set: set, sem: sem, hw: hw, k: history.KeysFor(redsem.DefaultPrefix, r.name)}
}

func (h *holder) emit(e history.Event) {
	e.Pid, e.W = os.Getpid(), -1
	require.NoError(h.t, h.hw.Write(e))
}

// now is Redis TIME (µs) on srv.
func (h *holder) now(srv *redistest.Server) int64 {
	v, err := redis.Int64s(h.set.Do(srv, "TIME"))
	require.NoError(h.t, err)
	return v[0]*1_000_000 + v[1]
}

// acquire takes a token and records the hold, with its deadline as master
// records it. It returns the Acquire's error without recording a hold.
func (h *holder) acquire(master *redistest.Server) (*redsem.Lease, error) {
	t0 := h.now(master)
	h.emit(history.Event{K: history.KWait, T0: t0})
	// Short: the replicas are stopped meanwhile, and must not look down to
	// the sentinels (down-after-milliseconds 1000).
	l, err := h.sem.Acquire(ctxT(h.t, 700*time.Millisecond))
	if err != nil {
		return nil, err
	}
	dl, err := redis.Int64(h.set.Do(master, "ZSCORE", h.k.Leases, l.Token()))
	require.NoError(h.t, err)
	h.emit(history.Event{K: history.KAcq, S: 1, Tok: l.Token(), Fence: l.Fence(), T0: t0, T: h.now(master), DL: dl, Valid: l.Valid()})
	return l, nil
}

// release records the end of the hold (Redis TIME of the master now in
// use) and releases.
func (h *holder) release(l *redsem.Lease) error {
	h.emit(history.Event{K: history.KRelStart, S: 1, Tok: l.Token(), Fence: l.Fence(), T: h.now(h.set.Master()), Valid: l.Valid()})
	err := l.Release(ctxT(h.t, 10*time.Second))
	class := "ok"
	if errors.Is(err, redsem.ErrLeaseLost) {
		class = "lost"
	} else if err != nil {
		class = "conn"
	}
	h.emit(history.Event{K: history.KRel, S: 1, Tok: l.Token(), Fence: l.Fence(), Class: class})
	return err
}
