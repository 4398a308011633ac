package redsem

// The explorer on an RWMutex (scenario.rw): clients RLock, Lock, TryRLock,
// TryLock, Release, Refresh and crash under the same scheduler, faults and
// time as the semaphore's programs. The invariants, after every step:
//
//  1. Exclusion, as the clients believe it: while a living client believes
//     it holds a write lease (Valid, not released), no other client
//     believes it holds any lease. And as Redis records it: the leases whose
//     deadline has not passed are any number of reads, or one write.
//  2. A client that believes it holds is recorded by Redis as the holder of
//     a lease of that mode whose deadline has not passed.
//  3. Fences strictly increase from grant to grant (reads included); meta's
//     fence never goes back.
//  4. TryLock and TryRLock never say no while the lock is free for them:
//     no live lease in the way and no waiter alive in the queue.
//  5. Release never returns nil unless Redis saw it take the lease back.
//  6. At the end every client finished, and once every lease's deadline
//     passed, a TryLock succeeds and leaves no reader, writer or waiter.
// Data loss suspends 1 (as Redis records it) and 2 for the leases granted
// before it.

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/engine"
	"github.com/stretchr/testify/require"
)

// rwView is an RWMutex as Redis holds it.
type rwView struct {
	fence   float64
	writer  string
	leases  map[string]float64 // acqID -> deadline ms
	modes   map[string]string  // acqID -> "r" or "w"
	fences  map[string]float64 // acqID -> fence
	queue   []string
	waiters map[string]float64 // acqID -> liveness deadline ms
}

func (v rwView) has(acq string) bool {
	_, ok := v.modes[acq]
	_, leased := v.leases[acq]
	return ok && leased
}

func (r *run) rwView() rwView {
	m, k := r.m, r.k
	v := rwView{leases: map[string]float64{}, modes: map[string]string{}, fences: map[string]float64{},
		waiters: map[string]float64{}}
	if m.Type(k.meta) == "hash" {
		v.fence, _ = strconv.ParseFloat(m.HGet(k.meta, "fence"), 64)
		v.writer = m.HGet(k.meta, "writer")
	}
	if m.Type(k.leases) == "zset" {
		members, _ := m.ZMembers(k.leases)
		for _, mem := range members {
			v.leases[mem], _ = m.ZScore(k.leases, mem)
		}
	}
	if m.Type(k.holders) == "hash" {
		fields, _ := m.HKeys(k.holders)
		for _, f := range fields {
			if !strings.HasPrefix(f, "h:") {
				continue
			}
			rec := strings.Split(m.HGet(k.holders, f), "|")
			if len(rec) >= 2 {
				v.modes[f[2:]] = rec[0]
				v.fences[f[2:]], _ = strconv.ParseFloat(rec[1], 64)
			}
		}
	}
	if m.Type(k.queue()) == "list" {
		v.queue, _ = m.List(k.queue())
	}
	if m.Type(k.waits) == "zset" {
		members, _ := m.ZMembers(k.waits)
		for _, mem := range members {
			if strings.HasPrefix(mem, "w:") {
				v.waiters[mem[2:]], _ = m.ZScore(k.waits, mem)
			}
		}
	}
	return v
}

// rwTrySnapshot is what a try's script found: whether the lock was free for
// it (invariant 4).
type rwTrySnapshot struct {
	client int
	free   bool
	why    string
}

// rwHeld is whether Redis recorded a client's lease before its Release's
// script ran.
type rwHeld bool

func (c *checker) rwBeforeExec(r *run, cl *vclient, cmd string) interface{} {
	switch {
	case cmd == "rw_acquire.lua" && (cl.cur.kind == opTryLock || cl.cur.kind == opTryRLock):
		v := r.rwView()
		nowMs := float64(r.w.now.UnixMilli())
		snap := &rwTrySnapshot{client: cl.id, free: true}
		for a, dl := range v.leases {
			if dl > nowMs && (cl.cur.kind == opTryLock || v.modes[a] == "w") {
				snap.free, snap.why = false, "a live lease"
			}
		}
		for _, a := range v.queue {
			if dl, ok := v.waiters[a]; ok && dl > nowMs {
				snap.free, snap.why = false, "a live waiter"
			}
		}
		return snap
	case cmd == "rw_release.lua" && cl.cur.kind == opRelease && cl.lease != nil:
		return rwHeld(r.rwView().has(cl.lease.acqID))
	}
	return nil
}

// rwTryRefused checks invariant 4 for cl's refused try (w.mu held).
func (c *checker) rwTryRefused(cl *vclient) {
	if s := c.rwTry; s != nil && s.client == cl.id && s.free && c.pending == "" {
		c.pending = fmt.Sprintf("c%d %v said no while the lock was free for it", cl.id, cl.cur)
	}
}

// checkRW tests invariants 1 to 3 and returns the first violation, or "".
func (c *checker) checkRW(r *run) string {
	v := r.rwView()
	nowMs := float64(r.w.Now().UnixMilli())
	var readers, writers []string
	for _, cl := range r.clients {
		releasing := cl.busy > 0 && cl.cur.kind == opRelease && cl.selfReleased
		if cl.dead || cl.lease == nil || cl.preLoss || releasing || !cl.lease.Valid() {
			continue
		}
		mode := cl.lease.token[len(cl.lease.token)-1:]
		who := fmt.Sprintf("c%d:%s", cl.id, mode)
		if mode == "w" {
			writers = append(writers, who)
		} else {
			readers = append(readers, who)
		}
		dl, leased := v.leases[cl.lease.acqID]
		switch {
		case v.modes[cl.lease.acqID] != mode:
			return fmt.Sprintf("c%d believes it holds a %s lease, but Redis records %q", cl.id, mode, v.modes[cl.lease.acqID])
		case !leased:
			return fmt.Sprintf("c%d believes it holds a %s lease, but Redis has no lease for it", cl.id, mode)
		case dl <= nowMs:
			return fmt.Sprintf("c%d believes it holds a %s lease, but it expired in Redis %vms ago", cl.id, mode, nowMs-dl)
		}
	}
	if len(writers) > 1 || len(writers) == 1 && len(readers) > 0 {
		return fmt.Sprintf("a writer shares the lock: writers %v, readers %v believe they hold", writers, readers)
	}
	if !r.loss {
		lw, lr := 0, 0
		for a, dl := range v.leases {
			if dl <= nowMs {
				continue
			}
			if v.modes[a] == "w" {
				lw++
			} else {
				lr++
			}
		}
		if lw > 1 || lw == 1 && lr > 0 {
			return fmt.Sprintf("Redis records %d live write leases beside %d live read leases", lw, lr)
		}
	}

	if v.fence < c.metaFence && !r.loss {
		return fmt.Sprintf("meta's fence went back from %.0f to %.0f", c.metaFence, v.fence)
	}
	c.metaFence = v.fence
	acqs := make([]string, 0, len(v.fences))
	for a := range v.fences {
		acqs = append(acqs, a)
	}
	sort.Slice(acqs, func(i, j int) bool { return v.fences[acqs[i]] < v.fences[acqs[j]] })
	for _, a := range acqs {
		f := v.fences[a]
		if c.fenced[a] {
			continue
		}
		if f <= c.maxFence {
			return fmt.Sprintf("acquisition %s was granted fence %.0f, not above an earlier grant's %.0f", a[:8], f, c.maxFence)
		}
		c.fenced[a] = true
		c.maxFence = f
	}
	return ""
}

// finalRW tests invariant 6.
func (c *checker) finalRW(r *run) string {
	w := r.w
	w.mu.Lock()
	w.advanceTo(w.now.Add(r.sc.ttl + r.sc.grace + engine.MaxBlock + engine.BlockSlack + time.Minute))
	w.mu.Unlock()
	ctx := context.Background()
	l, err := c.rwAdmin.TryLock(ctx)
	if err != nil {
		return "at the end the lock is not free: TryLock: " + err.Error()
	}
	defer func() { _ = l.Release(ctx) }()
	st, err := c.rwAdmin.Status(ctx)
	if err != nil {
		return "final Status failed: " + err.Error()
	}
	if len(st.Readers) > 0 || len(st.Queue) > 0 || st.Writer == nil {
		return fmt.Sprintf("at the end, beside the final TryLock: readers %v, writer %v, queue %v", st.Readers, st.Writer, st.Queue)
	}
	for _, key := range r.m.Keys() {
		// A doorbell rung for a waiter that died expires by itself
		// (PEXPIRE); one without a TTL would be left over for good.
		if strings.HasPrefix(key, r.k.base+"bell:") && r.m.TTL(key) <= 0 {
			return "a doorbell without a TTL is left over: " + key
		}
	}
	return ""
}

var (
	rlock   = op{kind: opRLock, cancelOK: true}
	wlock   = op{kind: opLock, cancelOK: true}
	tryR    = op{kind: opTryRLock}
	tryW    = op{kind: opTryLock}
	rwFirst = func(sc scenario) scenario { sc.rw = true; sc.size = 1; return holdersThen(sc) }
)

// rwScenarios are where the lock's features meet.
func rwScenarios() []scenario {
	return []scenario{
		rwFirst(scenario{
			name:  "rw: a writer queues behind a reader, a reader behind it",
			progs: [][]op{{rlock, rel}, {wlock, rel}, {rlock, rel}, {tryR}},
		}),
		rwFirst(scenario{
			name:  "rw: readers queued behind a writer, a process killed",
			progs: [][]op{{wlock, rel}, {rlock, rel}, {rlock, rel}}, kills: true, maxFaults: 1,
		}),
		rwFirst(scenario{
			name:  "rw: a waiter's context ends or its connection drops at the handoff",
			progs: [][]op{{rlock, rel}, {wlock, rel}, {rlock, rel}}, drops: true, maxFaults: 1,
		}),
		rwFirst(scenario{
			name: "rw: a reader shortens its lease and dies, a writer waits", ttl: 20 * time.Second,
			progs: [][]op{{rlock, {kind: opRefresh, ttl: 200 * time.Millisecond}, crash}, {wlock, rel}, {tryW}},
		}),
		rwFirst(scenario{
			name:  "rw: release across a restart that lost the data",
			progs: [][]op{{wlock, rel}, {rlock, rel}}, restart: true, maxFaults: 1,
		}),
	}
}

// randomRWScenario draws RW programs and faults from rng.
func randomRWScenario(rng *rand.Rand) scenario {
	sc := rwFirst(scenario{name: "random rw", drops: true, kills: true, maxFaults: rng.Intn(3),
		restart: rng.Intn(6) == 0, lazyDeliver: rng.Intn(2) == 0})
	if rng.Intn(3) == 0 {
		sc.ttl = time.Duration(200+rng.Intn(2000)) * time.Millisecond
	}
	for i, n := 0, 2+rng.Intn(3); i < n; i++ {
		var prog []op
		for j := 0; j < 1+rng.Intn(2); j++ {
			prog = append(prog, []op{rlock, rlock, wlock, wlock, tryR, tryW}[rng.Intn(6)])
			if rng.Intn(5) == 0 {
				prog = append(prog, op{kind: opRefresh, ttl: time.Duration(100+rng.Intn(20000)) * time.Millisecond})
			}
			if rng.Intn(8) == 0 {
				prog = append(prog, crash)
				break
			}
			prog = append(prog, rel)
		}
		sc.progs = append(sc.progs, prog)
	}
	return sc
}

func TestExplore_rwMutex(t *testing.T) {
	if !alone(t) {
		return
	}
	env := newExploreEnv(t)
	budget := exploreBudget(time.Second, 30*time.Second)
	exploreScenarios(t, env, budget, rwScenarios())
	exploreRandomPrograms(t, env, budget/2, func(seed int64, rng *rand.Rand) scenario {
		sc := randomRWScenario(rng)
		sc.name = fmt.Sprintf("random rw seed %d", seed)
		return sc
	})
}

// The RW invariants can fail: with rw_acquire.lua's fresh path made to let
// a writer in beside live readers, the explorer finds the overlap. Random
// schedules (seeds from 1, so the same every run) find it within a few;
// under REDSEM_LONG=1 the depth-first search must find it too (after some
// 600 schedules, 20 s on a 2-core machine).
func TestExplorer_catchesBrokenRWLock(t *testing.T) {
	if !alone(t) {
		return
	}
	src := engine.Source("rw_acquire.lua")
	const guard = "(mode == 'r' or not any_lease())"
	require.Contains(t, src, guard)
	saved := engine.RWAcquire
	engine.RWAcquire.Script = engine.Lua(6, strings.Replace(src, guard, "true", 1))
	defer func() { engine.RWAcquire = saved }()
	env := newExploreEnv(t)
	sc := rwScenarios()[0]
	cx, n := walkScenario(t, env, sc, 1, 40, time.Now().Add(time.Minute))
	t.Logf("random: found after %d schedules", n)
	require.Contains(t, cx, "a writer shares the lock")
	if longRun() {
		cx, n = exploreScenario(t, env, sc, exploreDepth, time.Now().Add(time.Minute))
		t.Logf("depth-first: found after %d schedules", n)
		require.Contains(t, cx, "a writer shares the lock")
	}
}
