package faults

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/cluster"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/sentinel"
)

// electLine is one line of the electworker log.
type electLine struct {
	kind   string // lead, write, lost, stale, resign
	id     int
	term   int64
	result string // write, stale: ok, refused or error
}

func readElectLog(t *testing.T, path string) []electLine {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		require.NoError(t, err)
	}
	var out []electLine
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		var e electLine
		e.kind = f[0]
		e.id, _ = strconv.Atoi(f[1])
		e.term, _ = strconv.ParseInt(f[2], 10, 64)
		if len(f) > 3 {
			e.result = f[3]
		}
		out = append(out, e)
	}
	return out
}

// electRun is a set of electworker processes on one election.
type electRun struct {
	t    *testing.T
	srv  *redistest.Server
	log  string
	name string
	ttl  time.Duration
	next int
	all  []*proc
}

func (r *electRun) spawn(args ...string) *proc {
	r.next++
	all := append([]string{"-addr", r.srv.Addr, "-name", r.name, "-ttl", r.ttl.String(), "-log", r.log,
		"-id", strconv.Itoa(r.next)}, args...)
	cmd := exec.Command(electWorkerBin, all...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(r.t, cmd.Start())
	p := &proc{id: r.next, cmd: cmd, stderr: &stderr, done: make(chan struct{}), start: time.Now()}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	r.all = append(r.all, p)
	return p
}

// leader is the worker leading now by the log: the last lead line with no
// resign or lost of its term after it.
func (r *electRun) leader() (id int, term int64, ok bool) {
	for _, e := range readElectLog(r.t, r.log) {
		switch e.kind {
		case "lead":
			id, term, ok = e.id, e.term, true
		case "resign", "lost":
			if e.term == term {
				ok = false
			}
		}
	}
	return id, term, ok
}

// Campaigners in real processes, each writing to a fenced resource while it
// leads: kill -9 of the leader again and again, then SIGSTOP of the leader
// past its TTL. One leader per term, terms strictly rising, no write
// refused while its writer still held a valid leadership (two leaders),
// the stopped leader sees Valid false before it acts again and the
// resource refuses its term, and a slow observer in this process sees
// every term the workers led, in order, with "no leader" between each two.
func TestElectionKillAndStopLeaders(t *testing.T) {
	t.Parallel()
	const ttl = 500 * time.Millisecond
	srv := redistest.Start(t)
	r := &electRun{t: t, srv: srv, log: filepath.Join(t.TempDir(), "elect.log"), name: "faults-elect", ttl: ttl}
	t.Cleanup(func() {
		for _, p := range r.all {
			if !p.exited() {
				_ = syscall.Kill(p.pid(), syscall.SIGCONT)
				p.kill9()
			}
		}
	})
	e, err := redsem.NewElection(srv.Pool(t), r.name)
	require.NoError(t, err)
	var mu sync.Mutex
	var seen []redsem.Leader
	octx, stopObserving := context.WithCancel(context.Background())
	observed := make(chan error, 1)
	go func() {
		observed <- e.Observe(octx, func(l redsem.Leader) {
			mu.Lock()
			seen = append(seen, l)
			mu.Unlock()
			time.Sleep(200 * time.Millisecond) // slower than the leaders change: changes pile up
		})
	}()

	procs := map[int]*proc{}
	for i := 0; i < 3; i++ {
		p := r.spawn("-hold", "150ms")
		procs[p.id] = p
	}
	// leaderAfter waits for a leader whose lead line comes after the
	// first n, and returns it and the count of lead lines.
	leaderAfter := func(n int) (int, int64, int) {
		var id, leads int
		var term int64
		require.True(t, waitFor(20*time.Second, func() bool {
			var ok bool
			id, term, ok = r.leader()
			leads = 0
			for _, l := range readElectLog(t, r.log) {
				if l.kind == "lead" {
					leads++
				}
			}
			return ok && leads > n
		}), "nobody took over after %d leaderships", n)
		return id, term, leads
	}
	kills := 3
	if soak() {
		kills = 20
	}
	leads := 0
	for i := 0; i < kills; i++ {
		var id int
		id, _, leads = leaderAfter(leads)
		procs[id].kill9()
		delete(procs, id)
		p := r.spawn("-hold", "150ms")
		procs[p.id] = p
	}

	// SIGSTOP a leader past its TTL, until another leads and wrote: one
	// that holds on (not caught resigning), with campaigners behind it.
	for _, p := range procs {
		p.kill9()
	}
	victim := r.spawn("-hold", "10m", "-iters", "1")
	id, stopped, leads := leaderAfter(leads)
	require.Equal(t, victim.id, id)
	for i := 0; i < 2; i++ {
		r.spawn("-hold", "150ms")
	}
	require.NoError(t, syscall.Kill(victim.pid(), syscall.SIGSTOP))
	require.True(t, waitFor(20*time.Second, func() bool {
		for _, l := range readElectLog(t, r.log) {
			if l.kind == "write" && l.term > stopped && l.result == "ok" {
				return true
			}
		}
		return false
	}), "no new leader wrote while the old one was stopped")
	require.NoError(t, syscall.Kill(victim.pid(), syscall.SIGCONT))
	var after []electLine
	require.True(t, waitFor(20*time.Second, func() bool {
		after = nil
		for _, l := range readElectLog(t, r.log) {
			if l.id == id && l.term == stopped && (l.kind == "lost" || l.kind == "stale") {
				after = append(after, l)
			}
		}
		return len(after) == 2
	}), "the resumed leader never reported its leadership lost")
	assert.Equal(t, []electLine{{kind: "lost", id: id, term: stopped}, {kind: "stale", id: id, term: stopped, result: "refused"}},
		after, "the stopped leader saw it lost before acting, and the resource refused its term")
	// The campaigners hand over among themselves a few times (each change
	// faster than the observer's f).
	leaderAfter(leads + 6)
	for _, p := range r.all {
		if !p.exited() {
			p.kill9()
		}
	}
	lines := readElectLog(t, r.log)
	// The slow observer catches up with every term led (or the checks
	// below say which it missed).
	waitFor(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		got := map[int64]bool{}
		for _, l := range seen {
			got[l.Term] = true
		}
		for _, l := range lines {
			if l.kind == "lead" && !got[l.term] {
				return false
			}
		}
		return true
	})
	stopObserving()
	<-observed

	leaderOf := map[int64]int{}
	var prev int64
	for _, l := range lines {
		switch l.kind {
		case "lead":
			assert.Greater(t, l.term, prev, "terms rise: %+v", l)
			prev = l.term
			if other, dup := leaderOf[l.term]; dup {
				t.Errorf("term %d led by workers %d and %d", l.term, other, l.id)
			}
			leaderOf[l.term] = l.id
		case "write":
			assert.Equal(t, "ok", l.result, "a write refused while its writer's leadership was valid: two leaders: %+v", l)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var terms []int64
	for _, l := range seen {
		if l.Term != 0 {
			terms = append(terms, l.Term)
		}
	}
	for i := 1; i < len(seen); i++ {
		assert.False(t, seen[i].Term != 0 && seen[i-1].Term != 0, "no \"no leader\" between terms %d and %d", seen[i-1].Term, seen[i].Term)
	}
	for i := 1; i < len(terms); i++ {
		assert.Greater(t, terms[i], terms[i-1], "the observer's terms rise")
	}
	for term := range leaderOf {
		assert.Contains(t, terms, term, "the observer missed a term")
	}
	t.Logf("%d leaderships, %d kill -9, 1 SIGSTOP; the observer saw %d changes, %d terms", len(leaderOf), kills, len(seen), len(terms))
}

// SENTINEL FAILOVER with a leader, a campaigner waiting and an observer,
// all finding the master through the sentinels (WAIT 1 after each write, so
// that the election's state is on the replica that takes over): the leader
// still leads on the new master (Proclaim), the campaigner, whose wait broke
// with the old master, leads next with a greater term, and the observer
// reports every change once, in order.
func TestElectionSentinelFailover(t *testing.T) {
	t.Parallel()
	set := redistest.StartSentinels(t, redistest.SentinelOptions{})
	ctx := ctxT(t, 3*time.Minute)
	newPool := func() *sentinel.Pool {
		p, err := sentinel.New(ctx, set.Addrs(), redistest.SentinelName, sentinel.WithWait(1, time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		return p
	}
	election := func() *redsem.Election {
		e, err := redsem.NewElection(newPool(), "failover", redsem.WithTTL(failoverCeiling))
		require.NoError(t, err)
		return e
	}
	require.NoError(t, set.WaitReplicas(set.Master(), 1, 20*time.Second))
	var mu sync.Mutex
	var seen []redsem.Leader
	octx, stopObserving := context.WithCancel(ctx)
	observed := make(chan error, 1)
	go func() {
		observed <- election().Observe(octx, func(l redsem.Leader) { mu.Lock(); seen = append(seen, l); mu.Unlock() })
	}()
	seenNow := func() []redsem.Leader { mu.Lock(); defer mu.Unlock(); return append([]redsem.Leader(nil), seen...) }
	require.True(t, waitFor(20*time.Second, func() bool { return len(seenNow()) == 1 }))

	a, err := election().Campaign(ctx, "a")
	require.NoError(t, err)
	won := make(chan *redsem.Leadership, 1)
	go func() {
		// A write not yet acknowledged by the replica (WAIT timed out on a
		// loaded machine, or across the failover) fails the campaign as
		// documented; the campaigner campaigns again.
		for {
			l, err := election().Campaign(ctx, "b")
			if errors.Is(err, cluster.ErrNotReplicated) && ctx.Err() == nil {
				t.Log(err)
				continue
			}
			if err != nil {
				t.Log(err)
				close(won)
				return
			}
			won <- l
			return
		}
	}()
	old := set.Master()
	require.True(t, waitFor(20*time.Second, func() bool { return blockedOn(t, set, old) == 1 }), "the campaigner never waited")
	m, took, err := set.Failover(failoverCeiling)
	require.NoError(t, err)
	require.NoError(t, a.Proclaim(ctx, "a2"), "the leader leads on the new master")
	require.NoError(t, a.Resign(ctx))
	b := <-won
	require.NotNil(t, b, "the campaigner led")
	assert.Greater(t, b.Term(), a.Term())
	want := []redsem.Leader{{}, {Term: a.Term(), Value: "a"}, {Term: a.Term(), Value: "a2"}, {}, {Term: b.Term(), Value: "b"}}
	require.True(t, waitFor(20*time.Second, func() bool { return len(seenNow()) >= len(want) }), "observed %v", seenNow())
	require.NoError(t, b.Resign(ctx))
	want = append(want, redsem.Leader{})
	require.True(t, waitFor(20*time.Second, func() bool { return len(seenNow()) >= len(want) }), "observed %v", seenNow())
	stopObserving()
	<-observed
	assert.Equal(t, want, seenNow())
	t.Logf("failover %s -> %s in %v", old.Addr, m.Addr, took.Round(time.Millisecond))
}
