package faults

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// rollingFrom is the release a rolling deploy starts from in
// TestRollingDeploy: the last commit of the stored layout before the shrink
// bookkeeping changed (withheld tokens, CHANGELOG "Unreleased").
const rollingFrom = "fd58745"

// A rolling deploy: workers built from rollingFrom and from this tree loop
// on one name at once, single and weighted acquisitions, with kill -9s of
// both kinds. Together they never hold more than N, and once they stop the
// semaphore is whole.
func TestRollingDeploy_oldAndNewClientsShareAName(t *testing.T) {
	t.Parallel()
	oldBin := buildWorkerAt(t, rollingFrom)
	srv := redistest.Start(t)
	r := newRun(t, srv, 3, 800*time.Millisecond, 300*time.Millisecond)
	end := time.Now().Add(scaled(5*time.Second, 10))
	common := []string{"-holdmin", "2ms", "-holdmax", "40ms", "-gapmax", "5ms"}
	// spawn starts a worker of the old build or of this one; every other
	// worker takes one or two permits a hold (AcquireN).
	spawn := func(old bool, i int) *proc {
		args := append([]string{"-dur", time.Until(end).Round(time.Millisecond).String()}, common...)
		if i%2 == 1 {
			args = append(args, "-weighted", "1,2")
		}
		if old {
			return r.spawnWith(oldBin, args...)
		}
		return r.spawn(args...)
	}
	live := map[bool][]*proc{}
	for i := 0; i < 8; i++ {
		old := i%2 == 0
		live[old] = append(live[old], spawn(old, i/2))
	}
	kills := 0
	for time.Now().Before(end.Add(-time.Second)) && kills < 6 {
		time.Sleep(400 * time.Millisecond)
		old := kills%2 == 0 // an old worker, then a new one
		ps := live[old]
		if victim := ps[0]; !victim.exited() {
			victim.kill9()
			kills++
		}
		live[old] = append(ps[1:], spawn(old, kills))
	}
	r.waitAll(60 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{})
	st, lost, took := quiesce(t, r.ops(), r.sem(), 20*time.Second)
	t.Logf("rolling deploy from %s: workers=%d kills=%d %s; quiesced in %v, tokens lost=%d",
		rollingFrom, len(r.procs), kills, rep.Summary(), took.Round(time.Millisecond), lost)
	assert.Zero(t, lost, "tokens lost: %+v", st)
	assert.Positive(t, kills, "nobody was killed")
	for _, old := range []bool{true, false} {
		n := count(evs, history.KAcq, func(e history.Event) bool { return r.builtAt(e.Pid) == old })
		assert.Positive(t, n, "no holds by the workers with old=%v", old)
	}
}

// builtAt reports whether the worker of pid ran a program other than this
// tree's worker.
func (r *run) builtAt(pid int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.procs {
		if p.pid() == pid {
			return p.bin != workerBin
		}
	}
	return false
}

// buildWorkerAt builds the worker of commit rev of this repository (git
// archive, go build) and returns its path. Without that commit (a shallow
// clone, an export without .git) the test is skipped, and says so.
func buildWorkerAt(t *testing.T, rev string) string {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): cannot build the worker of %s", err, rev)
	}
	root := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", rev+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this clone (shallow?): cannot build its worker", rev)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	require.NoError(t, os.Mkdir(src, 0o755))
	tar := filepath.Join(dir, "src.tar")
	out, err := exec.Command("git", "-C", root, "archive", "--output", tar, rev).CombinedOutput()
	require.NoError(t, err, "git archive %s: %s", rev, out)
	out, err = exec.Command("tar", "-xf", tar, "-C", src).CombinedOutput()
	require.NoError(t, err, "tar: %s", out)
	bin := filepath.Join(dir, "worker")
	build := exec.Command(goCommand(), "build", "-o", bin, "./internal/faults/worker")
	build.Dir = src
	out, err = build.CombinedOutput()
	require.NoError(t, err, "building the worker of %s: %s", rev, out)
	return bin
}
