package faults

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// rollingFrom is the release a rolling deploy starts from in
// TestRollingDeploy: the last commit of the stored layout before protocol v2
// (CHANGELOG "Unreleased": how to deploy across the change).
const rollingFrom = "fd58745"

// A rolling deploy across protocol v2: clients built from rollingFrom and
// from this tree on one name, single and weighted acquisitions, kill -9s of
// both kinds. While clients of the old layout hold or wait, a new client
// refuses the name (ErrWrongType, saying what to do) and grants nothing;
// once they are gone the next new client moves the name to the new layout,
// and from then on an old client refuses it (its scripts find no epoch:
// ErrCorrupt) and grants nothing. Together they never hold more than N,
// and once they stop the semaphore is whole.
func TestRollingDeploy_oldClientsAndNewNeverGrantTogether(t *testing.T) {
	t.Parallel()
	oldBin := buildWorkerAt(t, rollingFrom)
	srv := redistest.Start(t)
	r := newRun(t, srv, 3, 800*time.Millisecond, 300*time.Millisecond)
	common := []string{"-holdmin", "2ms", "-holdmax", "40ms", "-gapmax", "5ms"}
	// spawn starts a worker of the old build or of this one, for d; every
	// other worker takes one or two permits a hold (AcquireN).
	spawn := func(old bool, i int, d time.Duration) *proc {
		args := append([]string{"-dur", d.String()}, common...)
		if i%2 == 1 {
			args = append(args, "-weighted", "1,2")
		}
		if old {
			return r.spawnWith(oldBin, args...)
		}
		return r.spawn(args...)
	}
	phase := scaled(2500*time.Millisecond, 4)

	// The old layout in use: an old worker holding one permit throughout
	// (twice the phase, a TTL longer still), four looping, one of them
	// killed -9 as it goes (its lease, if any, lapses by itself); new
	// workers started while the first holds refuse the name.
	holder := r.spawnWith(oldBin, "-iters", "1", "-ttl", (4 * phase).String(),
		"-holdmin", (2 * phase).String(), "-holdmax", (2 * phase).String())
	olds := []*proc{holder}
	for i := 0; i < 4; i++ {
		olds = append(olds, spawn(true, i, phase))
	}
	require.Eventually(t, func() bool {
		evs, _, _ := history.Read(r.hist) // nil until a worker wrote
		return count(evs, history.KAcq, func(e history.Event) bool { return e.Pid == holder.pid() }) > 0
	}, 30*time.Second, 10*time.Millisecond, "the old holder never held")
	var refused []*proc
	for i := 0; i < 2; i++ {
		refused = append(refused, spawn(false, i, phase))
	}
	time.Sleep(phase / 3)
	olds[1].kill9()
	for _, p := range append(olds, refused...) {
		if p != olds[1] {
			require.True(t, p.wait(60*time.Second), "worker %d hung; stderr: %s", p.id, p.stderr.String())
		}
	}
	for _, p := range olds {
		if p != olds[1] {
			assert.Equal(t, 0, p.exitCode(), "old worker %d; stderr: %s", p.id, p.stderr.String())
		}
	}
	for _, p := range refused {
		assert.Equal(t, 3, p.exitCode(), "a new worker took a name the old clients use; stderr: %s", p.stderr.String())
	}
	// The killed worker's lease or registration, if it left one, keeps the
	// name in use until its deadline: a new client refuses it until then.
	var err error
	require.Eventually(t, func() bool {
		var l *redsem.Lease
		if l, err = r.sem().TryAcquire(context.Background()); err == nil {
			err = l.Release(context.Background())
		}
		return !errors.Is(err, redsem.ErrWrongType)
	}, 30*time.Second, 50*time.Millisecond, "the name never became free of the old clients")
	if !errors.Is(err, redsem.ErrNoToken) {
		require.NoError(t, err)
	}

	// The new layout: new workers (one killed -9) take the name over once
	// the old clients are gone; old workers started meanwhile refuse it.
	var news, late []*proc
	for i := 0; i < 4; i++ {
		news = append(news, spawn(false, i, phase))
	}
	time.Sleep(phase / 3)
	for i := 0; i < 2; i++ {
		late = append(late, spawn(true, i, phase))
	}
	time.Sleep(phase / 3)
	news[0].kill9()
	for _, p := range append(news[1:], late...) {
		require.True(t, p.wait(60*time.Second), "worker %d hung; stderr: %s", p.id, p.stderr.String())
	}
	for _, p := range news[1:] {
		assert.Equal(t, 0, p.exitCode(), "new worker %d; stderr: %s", p.id, p.stderr.String())
	}
	for _, p := range late {
		assert.Equal(t, 3, p.exitCode(), "an old worker took a name of the new layout; stderr: %s", p.stderr.String())
	}

	evs := r.events()
	rep := r.check(history.Options{})
	st, lost, took := quiesce(t, r.ops(), r.sem(), 20*time.Second)
	t.Logf("rolling deploy from %s: workers=%d %s; quiesced in %v, tokens lost=%d",
		rollingFrom, len(r.procs), rep.Summary(), took.Round(time.Millisecond), lost)
	assert.Zero(t, lost, "tokens lost: %+v", st)
	in := func(ps []*proc) func(history.Event) bool {
		return func(e history.Event) bool {
			for _, p := range ps {
				if p.pid() == e.Pid {
					return true
				}
			}
			return false
		}
	}
	assert.Positive(t, count(evs, history.KAcq, in(olds)), "no holds by the old workers")
	assert.Positive(t, count(evs, history.KAcq, in(news)), "no holds by the new workers after the old ones left")
	assert.Zero(t, count(evs, history.KAcq, in(append(refused, late...))), "a worker held a name of the other layout")
	fatal := func(ps []*proc, class, says string) {
		n := count(evs, history.KFatal, func(e history.Event) bool {
			return in(ps)(e) && e.Class == class && strings.Contains(e.Err, says)
		})
		assert.Equal(t, len(ps), n, "workers refused with %s saying %q; history: %v", class, says, fatals(evs))
	}
	fatal(refused, "wrongtype", "before protocol v2")
	fatal(late, "corrupt", "not a redsem meta record")
}

// fatals are the fatal events of a history, for a failure's message.
func fatals(evs []history.Event) []history.Event {
	var out []history.Event
	for _, e := range evs {
		if e.K == history.KFatal {
			out = append(out, e)
		}
	}
	return out
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
