package redsem

// The explorer with the options a user gets by default (scenario.defaults):
// shared waiting (WithWaitConnections 1), auto-refresh, DefaultTTL and
// DefaultGrace, and processes that run several goroutines on one Semaphore
// (scenario.process), so that the local queue, its pump, the hand-over and
// the last waiter's leaving are explored; the read-write lock with
// auto-refresh. Two invariants join explore_check_test.go's, for every
// configuration:
//
// 11. Auto-refresh runs as long as its lease: a lease under auto-refresh
//     that has not ended and was not released still has its auto-refresh
//     running (it gives up on no transient error). Checked after every step.
// 12. Nothing leaks: once the drain is over, every lease Redis still counts
//     as live is held by a client that believes it holds it (a lease
//     nobody holds would be kept alive by its auto-refresh as long as its
//     process lives). Checked before the final checks.

import (
	"fmt"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// check runs the checker's invariants and invariant 11.
func (r *run) check() string {
	if v := r.checkElection(); v != "" {
		return v
	}
	if v := r.chk.check(r); v != "" {
		return v
	}
	for _, cl := range r.clients {
		l := cl.lease
		if l == nil || l.sem.cfg.fixedTTL || l.ctx.Err() != nil || l.stopCtx.Err() != nil {
			continue
		}
		select {
		case <-l.refreshed:
			return fmt.Sprintf("c%d holds a lease that has neither ended nor been released, but its auto-refresh has stopped", cl.id)
		default:
		}
	}
	return ""
}

// leaked tests invariant 12.
func (r *run) leaked() string {
	held := map[string]bool{}
	for _, cl := range r.clients {
		if cl.lease != nil && cl.lease.Err() == nil {
			held[cl.lease.acqID] = true
		}
	}
	nowMs := float64(r.w.Now().UnixMilli())
	live := map[string]float64{} // acquisition -> deadline
	if r.sc.rw {
		for a, dl := range r.rwView().leases {
			live[a] = dl
		}
	} else {
		v := r.view()
		for tok, dl := range v.leases {
			live[v.holders[tok]] = dl
		}
	}
	for a, dl := range live {
		if dl > nowMs && !held[a] {
			return fmt.Sprintf("acquisition %.8s holds a lease live in Redis for %vms more that no client believes it holds: leaked", a, dl-nowMs)
		}
	}
	return ""
}

// exploreSeen counts what the library's own goroutines did in explored
// runs, to show that the defaults' paths are taken.
var exploreSeen seenCounts

type seenCounts struct{ autoRefreshs, pumpWaits atomic.Int64 }

// note counts cmd, run on a connection of the library's own goroutines.
func (c *seenCounts) note(cmd string) {
	switch cmd {
	case "refresh.lua", "rw_refresh.lua":
		c.autoRefreshs.Add(1)
	case "BLMOVE":
		c.pumpWaits.Add(1)
	}
}

// withDefaults makes sc's clients use the default options. Auto-refresh
// holds a lease for as long as its process lives, where a fixed TTL let it
// expire: so every program that may end holding (a setup holder's, one that
// does not end with Release or a crash) releases at its end, or a waiter
// behind it would wait forever, rightly.
func withDefaults(sc scenario) scenario {
	sc.defaults, sc.ttl, sc.grace = true, DefaultTTL, DefaultGrace
	setup := map[int]bool{}
	for _, id := range sc.setup {
		setup[id] = true
	}
	progs := make([][]op, len(sc.progs))
	for i, prog := range sc.progs {
		progs[i] = append([]op(nil), prog...)
		if _, shared := sc.shares[i]; shared || len(prog) == 0 && !setup[i] {
			continue
		}
		if n := len(prog); n == 0 || prog[n-1].kind != opRelease && prog[n-1].kind != opCrash {
			progs[i] = append(progs[i], rel)
		}
	}
	sc.progs = progs
	return sc
}

// defaultsScenarios are the semaphore's seam scenarios with the default
// options, after four made for them.
func defaultsScenarios() []scenario {
	out := []scenario{
		{
			name: "the last waiter leaves as its pump is granted", size: 1, setup: []int{0}, maxFaults: 1,
			progs: [][]op{{rel}, {acq, rel}},
		},
		{
			name: "goroutines of one process queue behind its pump, one leaves, a connection drops", size: 1, setup: []int{0},
			drops: true, maxFaults: 1,
			progs: [][]op{{rel}, {acq, rel}, {acq, rel}}, process: map[int]int{2: 1},
		},
		{
			name: "auto-refresh beside a user's Refresh and Release, connections dropping", size: 1, setup: []int{0},
			lazyDeliver: true, drops: true, maxFaults: 2,
			progs: [][]op{{{kind: opHold, ttl: 10 * time.Second}, {kind: opRefresh, ttl: 5 * time.Second}, rel}, {acq, rel}},
		},
		{
			name: "a holder and a waiter in one process, the process killed", size: 1, setup: []int{0}, kills: true, maxFaults: 1,
			progs: [][]op{{{kind: opHold, ttl: 15 * time.Second}, rel}, {acq, rel}, {acq, rel}}, process: map[int]int{1: 0},
		},
	}
	out = append(out, seamScenarios()...)
	for i := range out {
		out[i] = withDefaults(out[i])
	}
	return out
}

// inProcesses groups some of sc's clients into processes, drawn from a
// source of its own (seeded by seed): each client after the first joins an
// earlier one's process with probability one half.
func inProcesses(sc scenario, seed int64) scenario {
	rng := rand.New(rand.NewSource(seed ^ 0x9a0c))
	sc.process = map[int]int{}
	for i := 1; i < len(sc.progs); i++ {
		if rng.Intn(2) == 0 {
			sc.process[i] = rng.Intn(i)
		}
	}
	return sc
}

// exploreEach runs every schedule (within its slice of budget) and random
// schedules of each scenario, then random programs drawn by random, and
// fails on the first counterexample.
func exploreEach(t *testing.T, env *exploreEnv, scs []scenario, random func(rng *rand.Rand, seed int64) scenario, budget time.Duration) {
	slice := budget / time.Duration(2*len(scs)+2)
	for _, sc := range scs {
		cx, n, all := exploreAll(t, env, sc, exploreDepth, time.Now().Add(slice))
		t.Logf("%s: %d schedules to depth %d (all of them: %v)", sc.name, n, exploreDepth, all)
		if cx != "" {
			t.Fatal(cx)
		}
		cx, n = walkScenario(t, env, sc, 1, 40, time.Now().Add(slice))
		t.Logf("%s: %d random schedules", sc.name, n)
		if cx != "" {
			t.Fatal(cx)
		}
	}
	start := time.Now()
	n := 0
	for seed := firstSeed(t); time.Since(start) < 2*slice; seed++ {
		rng := rand.New(rand.NewSource(seed))
		sc := random(rng, seed)
		rc := &choiceRecorder{ch: &randomChooser{rng: rng, pFault: 0.1}}
		v, trace, err := exploreOnce(env, sc, rc, 60)
		require.NoError(t, err)
		n++
		if v != "" {
			t.Fatal(counterexample(sc, v, trace, rc.labels))
		}
	}
	t.Logf("%d random walks of random programs", n)
	t.Logf("the library's goroutines ran %d auto-refreshes and %d pump waits", exploreSeen.autoRefreshs.Load(), exploreSeen.pumpWaits.Load())
}

// TestExplore_defaults explores the semaphore with the default options:
// shared waiting among goroutines of one process, auto-refresh, the default
// TTL.
func TestExplore_defaults(t *testing.T) {
	if !alone(t) {
		return
	}
	exploreSeen = seenCounts{}
	exploreEach(t, newExploreEnv(t), defaultsScenarios(), func(rng *rand.Rand, seed int64) scenario {
		sc := inProcesses(withDefaults(randomScenario(rng)), seed)
		sc.name = fmt.Sprintf("random seed %d, defaults", seed)
		return sc
	}, exploreBudget(time.Second, 40*time.Second))
	require.Positive(t, exploreSeen.autoRefreshs.Load(), "auto-refresh never ran")
	require.Positive(t, exploreSeen.pumpWaits.Load(), "no pump ever waited")
}

// TestExplore_defaultsRW explores the read-write lock with the default
// options: auto-refresh, the default TTL.
func TestExplore_defaultsRW(t *testing.T) {
	if !alone(t) {
		return
	}
	exploreSeen = seenCounts{}
	scs := []scenario{rwFirst(scenario{
		name:  "rw: auto-refresh of a reader beside a user's Refresh, a writer waiting, connections dropping",
		drops: true, maxFaults: 2, lazyDeliver: true,
		progs: [][]op{{rlock, {kind: opHold, ttl: 10 * time.Second}, {kind: opRefresh, ttl: 5 * time.Second}, rel}, {wlock, rel}},
	})}
	scs = append(scs, rwScenarios()...)
	for i := range scs {
		scs[i] = withDefaults(scs[i])
	}
	exploreEach(t, newExploreEnv(t), scs, func(rng *rand.Rand, seed int64) scenario {
		sc := withDefaults(randomRWScenario(rng))
		sc.name = fmt.Sprintf("random rw seed %d, defaults", seed)
		return sc
	}, exploreBudget(time.Second, 20*time.Second))
	require.Positive(t, exploreSeen.autoRefreshs.Load(), "auto-refresh never ran")
}
