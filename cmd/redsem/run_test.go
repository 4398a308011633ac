//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Ten concurrent holders of a size-2 semaphore: the recorder's log, written
// with O_APPEND by each command as it starts and ends, never shows more than
// two running, and shows two at some point (so the check can fail).
func TestRunNeverMoreHoldersThanSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := filepath.Join(e.dir, "overlap.log")
	script := fmt.Sprintf(`echo "start $$" >> %[1]s; sleep 0.3; echo "end $$" >> %[1]s`, log)
	const n = 10
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = e.run(t, "run", "--size", "2", "-w", "15", "workers", "--", "sh", "-c", script)
		}()
	}
	wg.Wait()
	for i, r := range results {
		assert.Equal(t, 0, r.code, "process %d: %s", i, r.stderr)
	}
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 2*n)
	running, most := 0, 0
	for _, l := range lines {
		if strings.HasPrefix(l, "start ") {
			running++
		} else {
			running--
		}
		most = max(most, running)
	}
	assert.Equal(t, 2, most, "most commands running at once; log:\n%s", b)
	assert.Equal(t, 0, running)
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"zero", []string{"--", "true"}, 0},
		{"child code", []string{"--", "sh", "-c", "exit 7"}, 7},
		{"flock -c", []string{"-c", "exit 3"}, 3},
		{"killed by signal", []string{"--", "sh", "-c", "kill -KILL $$"}, 128 + 9},
		{"not found", []string{"--", "no-such-command-redsem"}, exitNotFound},
		{"not executable", []string{"--", e.dir}, exitCannotExec},
		{"env", []string{"--", "sh", "-c",
			`test "$REDSEM_NAME" = codes && test "$REDSEM_SIZE" = 1 && test "$REDSEM_SLOT" = 1 &&
			 test "$REDSEM_FENCE" -gt 0 && test "${REDSEM_TOKEN%:1}" != "$REDSEM_TOKEN" || exit 9`}, 0},
	} {
		r := e.run(t, append([]string{"run", "--size", "1", "codes"}, tc.args...)...)
		assert.Equal(t, tc.code, r.code, "%s: stderr %q", tc.name, r.stderr)
		assert.LessOrEqual(t, strings.Count(r.stderr, "\n"), 1, "%s: one line at most: %q", tc.name, r.stderr)
	}
	// The slot was given back every time.
	r := e.run(t, "status", "--json", "codes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"available": 1`)
}

// A held slot makes -n, -w and --timeout 0 give up with flock's code, or -E's.
func TestRunBusy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	holder := e.start(t, helperEnvFor(), append([]string{"run", "busy"}, helperArgs()...)...)
	waitHelper(t, e.dir, "child")

	r := e.run(t, "run", "-n", "busy", "--", "true")
	assert.Equal(t, exitBusy, r.code)
	assert.Empty(t, r.stderr, "busy is silent without -v, as with flock")
	r = e.run(t, "run", "-n", "-E", "42", "-v", "busy", "--", "true")
	assert.Equal(t, 42, r.code)
	assert.Contains(t, r.stderr, "no slot free")
	r = e.run(t, "run", "--timeout", "0", "busy", "--", "true")
	assert.Equal(t, exitBusy, r.code)
	r = e.run(t, "run", "-w", "0.3", "busy", "--", "true")
	assert.Equal(t, exitBusy, r.code)
	assert.GreaterOrEqual(t, r.took, 300*time.Millisecond)

	require.NoError(t, syscall.Kill(holder.cmd.Process.Pid, syscall.SIGTERM))
	assert.Equal(t, 5, holder.wait(t, 10*time.Second), "the helper exits 5 on TERM")
	r = e.run(t, "run", "-n", "busy", "--", "true")
	assert.Equal(t, 0, r.code, "free again after the holder exited: %s", r.stderr)
}

// INT, TERM and HUP reach the command and what it started (its process
// group), and redsem exits with the command's code.
func TestRunForwardsSignalsToTheGroup(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		e := newEnv(t)
		p := e.start(t, helperEnvFor("HELPER_GRANDCHILD=1"), append([]string{"run", "sig"}, helperArgs()...)...)
		waitHelper(t, e.dir, "child")
		waitHelper(t, e.dir, "grandchild")
		require.NoError(t, syscall.Kill(p.cmd.Process.Pid, sig))
		assert.Equal(t, 5, p.wait(t, 10*time.Second), "%v: the child's exit code; stderr %s", sig, p.stderr)
		log := logLines(e.dir)
		assert.Contains(t, log, "child got "+sig.String())
		assert.Contains(t, log, "grandchild got "+sig.String())
	}
}

// redsem killed with SIGKILL: its command and the command's children die
// (parent-death signal and guard), and the slot frees itself within the TTL.
func TestRunKilledHolderFreesSlotAndStopsCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.start(t, helperEnvFor("HELPER_GRANDCHILD=1", "HELPER_TERM=ignore"),
		append([]string{"run", "--ttl", "1s", "crash"}, helperArgs()...)...)
	child := waitHelper(t, e.dir, "child")
	grand := waitHelper(t, e.dir, "grandchild")
	require.True(t, alive(child))
	require.True(t, alive(grand))

	require.NoError(t, syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL))
	killed := time.Now()
	p.wait(t, 5*time.Second)
	waitFor(t, 3*time.Second, "the command to die", func() bool { return !alive(child) })
	waitFor(t, 3*time.Second, "the command's child to die", func() bool { return !alive(grand) })

	r := e.run(t, "run", "-w", "10", "crash", "--", "true")
	assert.Equal(t, 0, r.code, "the slot came back within -w 10: %s", r.stderr)
	t.Logf("slot back %v after the kill (TTL 1s)", time.Since(killed))
}

// A lease deleted under a running command (of the mutex NAME, which
// delete acts on): the command gets TERM, ignores
// it, gets KILL after --kill-after, and redsem exits 75.
func TestRunLeaseLostStopsCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.start(t, helperEnvFor("HELPER_TERM=ignore"),
		append([]string{"run", "--size", "1", "--ttl", "1s", "--kill-after", "300ms", "lost"}, helperArgs()...)...)
	child := waitHelper(t, e.dir, "child")

	r := e.run(t, "delete", "--force", "lost")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, exitLost, p.wait(t, 5*time.Second), "stderr %s", p.stderr)
	assert.False(t, alive(child), "the command was killed")
	assert.Contains(t, logLines(e.dir), "child got terminated", "TERM came first")
	assert.Contains(t, p.stderr.String(), "lease lost")
	assert.Equal(t, 1, strings.Count(p.stderr.String(), "\n"), "one line: %q", p.stderr)
}

// Redis unreachable past the TTL (server stopped): the lease expires
// locally, the command is stopped, redsem exits with --lost-exit-code.
func TestRunRedisUnreachableStopsCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.start(t, helperEnvFor(),
		append([]string{"run", "--ttl", "1s", "--lost-exit-code", "99", "frozen"}, helperArgs()...)...)
	child := waitHelper(t, e.dir, "child")
	require.NoError(t, e.srv.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = e.srv.Signal(syscall.SIGCONT) })

	assert.Equal(t, 99, p.wait(t, 8*time.Second), "stderr %s", p.stderr)
	assert.False(t, alive(child))
	assert.Contains(t, p.stderr.String(), "lease expired")
}

// The command finished, but its lease was gone by then (here: it deleted
// the mutex itself, long before the first refresh): exit 75, not 0.
func TestRunLeaseGoneAtReleaseIsLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(t, "run", "--size", "1", "gone", "--", bin, "delete", "--force", "gone")
	assert.Equal(t, exitLost, r.code, r.stderr)
	assert.Contains(t, r.stderr, "lost before the command finished")
}

// -s holders share the lock NAME; a -x holder (the default) runs alone. The
// log of starts and ends shows two -s commands overlapping and no -x
// command overlapping anything.
func TestRunSharedAndExclusive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := filepath.Join(e.dir, "rw.log")
	script := func(tag string) string {
		return fmt.Sprintf(`echo "start %[2]s" >> %[1]s; sleep 0.3; echo "end %[2]s" >> %[1]s; test "$REDSEM_SLOT" = %[3]s`,
			log, tag, map[string]string{"s": "r", "x": "w"}[tag[:1]])
	}
	var wg sync.WaitGroup
	results := map[string]*result{}
	var mu sync.Mutex
	for _, tag := range []string{"s1", "s2", "x1", "s3", "x2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"run", "-w", "15", "index", "-c", script(tag)}
			if tag[0] == 's' {
				args = append([]string{"run", "-s"}, args[1:]...)
			}
			r := e.run(t, args...)
			mu.Lock()
			results[tag] = &r
			mu.Unlock()
		}()
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	for tag, r := range results {
		assert.Equal(t, 0, r.code, "%s: %s", tag, r.stderr)
	}
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	open := map[string]bool{}
	most := 0
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		what, tag, _ := strings.Cut(l, " ")
		if what == "end" {
			delete(open, tag)
			continue
		}
		for o := range open {
			assert.False(t, tag[0] == 'x' || o[0] == 'x', "%s started while %s ran; log:\n%s", tag, o, b)
		}
		open[tag] = true
		most = max(most, len(open))
	}
	assert.GreaterOrEqual(t, most, 2, "no two -s commands ran at once; log:\n%s", b)

	r := e.run(t, "run", "-s", "-x", "index", "--", "true")
	assert.Equal(t, exitUsage, r.code)
	r = e.run(t, "run", "-s", "--size", "2", "index", "--", "true")
	assert.Equal(t, exitUsage, r.code)
}

// redsem status NAME shows the lock that redsem run NAME holds (the write
// side by default) when no semaphore NAME exists, in the table and in JSON.
func TestStatusShowsTheLockRunHolds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	holder := e.start(t, nil, "run", "nightly", "--", "sleep", "30")
	var st rwStatusJSON
	require.Eventually(t, func() bool {
		r := e.run(t, "status", "--json", "nightly")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &st) == nil && st.Held == 1
	}, 10*time.Second, 50*time.Millisecond, "status never showed the holder")
	assert.Equal(t, "rwmutex", st.Kind)
	assert.True(t, st.Writer)
	assert.Equal(t, 0, st.Readers)
	require.Len(t, st.Holders, 1)
	assert.Contains(t, st.Holders[0].Label, "sleep")

	r := e.run(t, "status", "nightly")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "rwmutex")
	assert.Contains(t, r.stdout, "write")
	_ = syscall.Kill(-holder.cmd.Process.Pid, syscall.SIGTERM)
	holder.wait(t, 15*time.Second)
}

// --idle-expiry: status shows how long the idle semaphore has left, and
// then it is gone; the lock refuses the flag.
func TestRunIdleExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(t, "run", "--size", "2", "--idle-expiry", "300ms", "tenant-7", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "status", "tenant-7")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "expires    in ")
	r = e.run(t, "status", "--json", "tenant-7")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"idle_expiry_ms": 300`)
	time.Sleep(400 * time.Millisecond)
	r = e.run(t, "status", "tenant-7")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"tenant-7" does not exist`)

	r = e.run(t, "run", "--idle-expiry", "1s", "lock-7", "--", "true")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, "--idle-expiry")
}
