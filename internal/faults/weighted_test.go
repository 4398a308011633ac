package faults

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// holdsByK counts the holds by their number of tokens.
func holdsByK(evs []history.Event) map[int]int {
	out := map[int]int{}
	for _, e := range evs {
		if e.K == history.KAcq && e.Valid {
			out[max(len(e.Toks), 1)]++
		}
	}
	return out
}

// waitsByK returns, for each number of permits asked for, the longest and
// the 99th percentile wait (from the Redis TIME before AcquireN to the one
// after it returned) of the granted acquisitions.
func waitsByK(evs []history.Event) map[int][2]time.Duration {
	all := map[int][]int64{}
	for _, e := range evs {
		if e.K == history.KAcq && e.T0 > 0 && e.T >= e.T0 {
			k := max(len(e.Toks), 1)
			all[k] = append(all[k], e.T-e.T0)
		}
	}
	out := map[int][2]time.Duration{}
	for k, ws := range all {
		slices.Sort(ws)
		out[k] = [2]time.Duration{time.Duration(ws[len(ws)-1]) * time.Microsecond, time.Duration(ws[len(ws)*99/100]) * time.Microsecond}
	}
	return out
}

// openPermits returns, for each pid, the permits of its holds that the
// history shows open (an acq with no relstart yet).
func openPermits(evs []history.Event) map[int]int {
	type key struct{ pid, g, s int }
	open := map[key]int{}
	for _, e := range evs {
		switch e.K {
		case history.KAcq:
			open[key{e.Pid, e.G, e.S}] = max(len(e.Toks), 1)
		case history.KRelStart:
			delete(open, key{e.Pid, e.G, e.S})
		}
	}
	out := map[int]int{}
	for k, n := range open {
		out[k.pid] += n
	}
	return out
}

// Weighted acquire under faults: processes of several goroutines, each hold
// AcquireN(k) with k drawn from {1, 2, 3} on a semaphore of 4 (so AcquireN
// collectors, shared-waiting Acquire callers and the collector ticket all
// meet), while random processes are killed -9 (collectors holding part of
// what they need among them) or frozen (SIGSTOP) past the TTL and resumed.
// The checker counts permits: a k-hold counts k toward the size.
func TestWeightedKillAndStop(t *testing.T) {
	t.Parallel()
	const n, procs, gor = 4, 4, 3
	const ttl = 600 * time.Millisecond
	srv := redistest.Start(t)
	r := newRun(t, srv, n, ttl, 200*time.Millisecond,
		"-goroutines", strconv.Itoa(gor), "-weighted", "1,2,3", "-acqtimeout", "8s")
	runFor := scaled(6*time.Second, 10)
	end := time.Now().Add(runFor)
	spawn := func() *proc {
		return r.spawn("-dur", time.Until(end).Round(time.Millisecond).String(),
			"-holdmin", "5ms", "-holdmax", "40ms", "-gapmax", "10ms")
	}
	var live []*proc
	for i := 0; i < procs; i++ {
		live = append(live, spawn())
	}
	// One process at a time is frozen, 2.5 TTLs, by a goroutine of its own,
	// while kills go on.
	kills, stops := 0, 0
	var stopped atomic.Pointer[proc]
	var thawed sync.WaitGroup
	defer thawed.Wait()
	for i := 0; time.Now().Before(end.Add(-3*ttl)) && i < 1000; i++ {
		time.Sleep(time.Duration(150+rand.IntN(250)) * time.Millisecond)
		for j, p := range live {
			if p.exited() {
				live[j] = spawn()
			}
		}
		j := rand.IntN(len(live))
		if i%2 == 1 {
			// Freeze a process that holds permits now, if one does within
			// 300ms: most of the time goroutines wait.
			waitFor(300*time.Millisecond, func() bool {
				evs, _, err := history.Read(r.hist)
				if err != nil {
					return false
				}
				held := openPermits(evs)
				for jj, p := range live {
					if held[p.pid()] > 0 && p != stopped.Load() {
						j = jj
						return true
					}
				}
				return false
			})
		}
		v := live[j]
		if v == stopped.Load() {
			continue
		}
		if i%2 == 0 {
			// live[0] is never killed, so a worker is left alone long
			// enough to check that its goroutines are served.
			if j == 0 {
				j = 1 + rand.IntN(len(live)-1)
				v = live[j]
			}
			if v == stopped.Load() {
				continue
			}
			v.kill9()
			kills++
			live[j] = spawn()
			continue
		}
		if !stopped.CompareAndSwap(nil, v) {
			continue
		}
		if syscall.Kill(v.pid(), syscall.SIGSTOP) != nil {
			stopped.Store(nil)
			continue
		}
		stops++
		thawed.Add(1)
		go func() {
			defer thawed.Done()
			time.Sleep(5 * ttl / 2)
			_ = syscall.Kill(v.pid(), syscall.SIGCONT)
			stopped.Store(nil)
		}()
	}
	thawed.Wait()
	r.waitAll(40 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{})
	st, lost, took := quiesce(t, r.ops(), r.sem(), 15*time.Second)
	k := history.KeysFor("redsem:", r.name)
	assert.Empty(t, pendKeys(t, srv, k), "pending lists left")
	admin := adminConn(t, srv)
	wq, err := redis.Int(admin.Do("LLEN", k.Base+"wqueue"))
	require.NoError(t, err)
	checked, served := servedGoroutines(t, evs, r.procs, nil, gor, end, 3*time.Second)
	byK := holdsByK(evs)
	revived := count(evs, history.KRevived, nil)
	t.Logf("weighted, kill -9 and SIGSTOP past the TTL: clients=%d processes x %d goroutines (%d holders), AcquireN(k) k in {1,2,3} on N=%d; kills=%d stops=%d (%v each, TTL %v; holders revived past their lease=%d); holds by k=%v, longest and p99 wait by k=%v %s; max overlap %d permits of N=%d; goroutines served %d/%d; quiesced in %v, tokens lost=%d, rejected=%d, weighted queue left=%d",
		len(r.procs), gor, rep.Holders, n, kills, stops, 5*ttl/2, ttl, revived, byK, waitsByK(evs), rep.Summary(), rep.MaxOverlap, n, served, checked, took.Round(time.Millisecond), lost, st.Rejected, wq)
	assert.Zero(t, lost, "tokens lost")
	assert.Zero(t, rep.Starved, "starved waiters")
	assert.Positive(t, kills)
	assert.Positive(t, stops)
	assert.Positive(t, byK[3], "no hold of 3 permits")
	assert.Positive(t, byK[2], "no hold of 2 permits")
	assert.Positive(t, byK[1], "no hold of 1 permit")
	assert.Positive(t, checked, "no worker was left alone long enough to check that its goroutines were served")
}

// A weighted collector killed -9 while it collects, with the default grace
// (5s) and long block times: its tokens come back by its registration's
// lapse, not by the hour its partial leases are good for, and a grant of 3
// permits follows. Processes loop AcquireN(3) on a semaphore of 4, so while
// one holds 3 permits the next collects the fourth and a third queues for
// the ticket; the test kills the collector (a holder with fence 0 in Status,
// whose label names its process). A release between that Status and the
// kill may still seal its grant (Redis runs its script behind the doorbell's
// BLPOP without its client): that kill killed a holder, whose tokens come
// back by the TTL, and is counted apart; holds of 100-300ms make it rare.
// How long the hand-on takes in Redis time is logged, not judged (the
// process taking over must have written its wait in time, which load
// delays): TestSemaphore_AcquireN_deadCollectorHandOnInRedisTime bounds it.
func TestWeightedCollectorKilled(t *testing.T) {
	t.Parallel()
	const n, procs, k, ttl = 4, 3, 3, 2 * time.Second
	srv := redistest.Start(t)
	r := newRun(t, srv, n, ttl, 5*time.Second, "-weighted", strconv.Itoa(k), "-acqtimeout", "30s")
	end := time.Now().Add(scaled(12*time.Second, 5))
	spawn := func() *proc {
		return r.spawn("-dur", time.Until(end).Round(time.Millisecond).String(),
			"-holdmin", "100ms", "-holdmax", "300ms", "-gapmax", "10ms")
	}
	var live []*proc
	for i := 0; i < procs; i++ {
		live = append(live, spawn())
	}
	ops := r.ops()
	// held lists the fences of the leases the process pid holds.
	held := func(pid int) []int64 {
		var fences []int64
		for _, h := range status(t, ops).Holders {
			if _, p, _ := strings.Cut(h.Label, ":"); p == strconv.Itoa(pid) {
				fences = append(fences, h.Fence)
			}
		}
		return fences
	}
	var kills []int64 // Redis TIME (µs) of the Status each kill of a collector followed
	var lateKills int // kills that landed after the victim's grant
	for time.Now().Before(end.Add(-4 * time.Second)) {
		victim, at := -1, int64(0)
		waitFor(2*time.Second, func() bool {
			st := status(t, ops)
			for _, h := range st.Holders {
				_, pid, ok := strings.Cut(h.Label, ":")
				if h.Fence != 0 || !ok {
					continue
				}
				for j, p := range live {
					if strconv.Itoa(p.pid()) == pid && !p.exited() {
						victim, at = j, st.ServerTime.UnixMicro()
						return true
					}
				}
			}
			return false
		})
		if victim < 0 {
			continue
		}
		pid := live[victim].pid()
		live[victim].kill9()
		live[victim] = spawn()
		fences := held(pid)
		if len(fences) == 0 || slices.ContainsFunc(fences, func(f int64) bool { return f != 0 }) {
			lateKills++
		} else {
			kills = append(kills, at)
		}
		// Its tokens come back (PARTIAL_MS, what the partial leases are
		// good for, is an hour).
		assert.True(t, waitFor(20*time.Second, func() bool { return len(held(pid)) == 0 }),
			"the killed process %d still holds %v", pid, held(pid))
		time.Sleep(500 * time.Millisecond) // a few grants before the next kill
	}
	r.waitAll(40 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{})
	_, lost, _ := quiesce(t, r.ops(), r.sem(), 15*time.Second)
	var handOns []time.Duration
	for _, at := range kills {
		// The next grant of k permits after the kill, at the Redis time the
		// lease started (its deadline less the fixed TTL).
		next := int64(0)
		for _, e := range evs {
			granted := e.DL*1000 - ttl.Microseconds()
			if e.K == history.KAcq && e.Valid && len(e.Toks) == k && e.DL > 0 && granted > at && (next == 0 || granted < next) {
				next = granted
			}
		}
		if next == 0 {
			t.Errorf("no grant of %d permits after the kill at %d", k, at)
			continue
		}
		handOns = append(handOns, time.Duration(next-at)*time.Microsecond)
	}
	t.Logf("weighted collector killed -9: AcquireN(%d) in %d processes on N=%d, TTL %v, grace 5s; kills of a collector=%d (and %d that landed after its grant); next grant of %d permits after each, in Redis time: %v (the protocol's bound: collectPoll + collectGrace, 1s, after the collector's last check-in); holds by k=%v %s; tokens lost=%d",
		k, procs, n, ttl, len(kills), lateKills, k, handOns, holdsByK(evs), rep.Summary(), lost)
	assert.Positive(t, len(kills), "no collector was caught collecting")
	assert.Zero(t, lost, "tokens lost")
}
