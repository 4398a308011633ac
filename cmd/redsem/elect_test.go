//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leaderScript is an elected command: it records its pid and term under
// dir as <who>.pid and <who>.term, then sleeps until stopped.
func leaderScript(dir, who string) []string {
	return []string{"-c", `echo $$ > ` + filepath.Join(dir, who+".pid") + `; echo "$REDSEM_TERM" > ` +
		filepath.Join(dir, who+".term") + `; exec sleep 60`}
}

// readInt reads the number in dir/name, or 0.
func readInt(dir, name string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func (e *env) leaderNow(t *testing.T, name string) leaderJSON {
	t.Helper()
	r := e.run(t, "leader", "--json", name)
	require.Equal(t, 0, r.code, r.stderr)
	var l leaderJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &l), r.stdout)
	return l
}

// kill -9 of the leading redsem: its command dies with it, and the waiting
// campaigner's command starts within the TTL, with a greater term.
func TestElectKilledLeaderHandsOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.start(t, nil, append([]string{"elect", "--ttl", "1s", "--value", "A", "jobs"}, leaderScript(e.dir, "A")...)...)
	waitFor(t, 10*time.Second, "A to lead", func() bool { return readInt(e.dir, "A.term") > 0 })
	b := e.start(t, nil, append([]string{"elect", "--ttl", "1s", "--value", "B", "jobs"}, leaderScript(e.dir, "B")...)...)
	assert.Equal(t, "A", e.leaderNow(t, "jobs").Value)

	aCmd := int(readInt(e.dir, "A.pid"))
	require.NoError(t, syscall.Kill(a.cmd.Process.Pid, syscall.SIGKILL))
	a.wait(t, 5*time.Second)
	waitFor(t, 10*time.Second, "A's command to die", func() bool { return !alive(aCmd) })
	waitFor(t, 10*time.Second, "B to lead", func() bool { return readInt(e.dir, "B.term") > 0 })
	assert.Greater(t, readInt(e.dir, "B.term"), readInt(e.dir, "A.term"))
	now := e.leaderNow(t, "jobs")
	assert.Equal(t, leaderJSON{Kind: "election", Name: "jobs", Leading: true, Term: readInt(e.dir, "B.term"), Value: "B"}, now)

	require.NoError(t, syscall.Kill(b.cmd.Process.Pid, syscall.SIGTERM))
	assert.Equal(t, 128+int(syscall.SIGTERM), b.wait(t, 10*time.Second), "the command's own end: %s", b.stderr)
	assert.False(t, e.leaderNow(t, "jobs").Leading, "resigned on the way out")
}

// A leading redsem stopped (SIGSTOP) past its TTL loses: the other
// campaigner leads with a greater term, and once the old one runs again it
// stops its command and exits 75.
func TestElectStoppedLeaderLoses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.start(t, nil, append([]string{"elect", "--ttl", "500ms", "--kill-after", "300ms", "--value", "A", "stop"},
		leaderScript(e.dir, "A")...)...)
	waitFor(t, 10*time.Second, "A to lead", func() bool { return readInt(e.dir, "A.term") > 0 })
	e.start(t, nil, append([]string{"elect", "--ttl", "500ms", "--value", "B", "stop"}, leaderScript(e.dir, "B")...)...)
	aCmd := int(readInt(e.dir, "A.pid"))
	require.NoError(t, syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP))
	waitFor(t, 10*time.Second, "B to lead", func() bool { return readInt(e.dir, "B.term") > 0 })
	assert.Greater(t, readInt(e.dir, "B.term"), readInt(e.dir, "A.term"))
	require.NoError(t, syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT))
	assert.Equal(t, exitLost, a.wait(t, 10*time.Second), "stderr %s", a.stderr)
	assert.False(t, alive(aCmd), "A's command was stopped")
	assert.Equal(t, "B", e.leaderNow(t, "stop").Value)
}

// Not elected within -w: exit 1 (or -E's code), and the command never ran.
func TestElectWaitRunsOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, nil, append([]string{"elect", "--value", "A", "busy"}, leaderScript(e.dir, "A")...)...)
	waitFor(t, 10*time.Second, "A to lead", func() bool { return readInt(e.dir, "A.term") > 0 })
	r := e.run(t, "elect", "-w", "200ms", "busy", "--", "touch", filepath.Join(e.dir, "ran"))
	assert.Equal(t, exitBusy, r.code, r.stderr)
	r = e.run(t, "elect", "-w", "200ms", "-E", "9", "busy", "--", "touch", filepath.Join(e.dir, "ran"))
	assert.Equal(t, 9, r.code, r.stderr)
	assert.NoFileExists(t, filepath.Join(e.dir, "ran"))
	r = e.run(t, "elect", "busy")
	assert.Equal(t, exitUsage, r.code, "no command: %s", r.stderr)
}

// leader --watch prints the leader, then every change, each once, and
// exits 0 on TERM.
func TestLeaderWatchStreamsChanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cmd := e.command(context.Background(), "leader", "--watch", "--json", "w")
	var mu sync.Mutex
	var out bytes.Buffer
	cmd.Stdout = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	require.NoError(t, cmd.Start())
	lines := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Split(strings.TrimSpace(out.String()), "\n")
	}
	waitFor(t, 10*time.Second, "the first line", func() bool { return lines()[0] != "" })
	for _, v := range []string{"A", "B"} {
		r := e.run(t, "elect", "--value", v, "w", "--", "true")
		require.Equal(t, 0, r.code, r.stderr)
	}
	waitFor(t, 10*time.Second, "five lines", func() bool { return len(lines()) >= 5 })
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
	var got []string
	for _, l := range lines() {
		var j leaderJSON
		require.NoError(t, json.Unmarshal([]byte(l), &j), l)
		got = append(got, j.Value)
		assert.Equal(t, j.Leading, j.Term != 0, l)
	}
	assert.Equal(t, []string{"", "A", "", "B", ""}, got)
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// status shows an election as one, and delete removes every key of it: the
// leading redsem elect then loses its leadership, stops its command and
// exits 75, and the name is gone.
func TestStatusAndDeleteOfAnElection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.start(t, nil, append([]string{"elect", "--ttl", "1s", "--value", "A", "sched"}, leaderScript(e.dir, "A")...)...)
	waitFor(t, 10*time.Second, "A to lead", func() bool { return readInt(e.dir, "A.term") > 0 })
	term := readInt(e.dir, "A.term")

	r := e.run(t, "status", "sched")
	require.Equal(t, 0, r.code, r.stderr)
	assert.True(t, strings.HasPrefix(r.stdout, "election   sched\nleader     A\n"), r.stdout)
	assert.Contains(t, r.stdout, "term       "+strconv.FormatInt(term, 10)+"\n")
	r = e.run(t, "status", "--json", "--kind", "election", "sched")
	require.Equal(t, 0, r.code, r.stderr)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
	assert.Equal(t, "election", doc["kind"])
	assert.Equal(t, "A", doc["value"])
	assert.Equal(t, []any{"election"}, doc["kinds"])

	r = e.run(t, "delete", "sched")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, `"sched" is an election (A leads, term `+strconv.FormatInt(term, 10)+`)`)
	r = e.run(t, "delete", "--force", "-v", "sched")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^deleted "sched": election \(\d+ keys\)\n`, r.stdout)
	for _, k := range []string{"el:meta", "el:leases", "el:holders", "el:leader", "el:log"} {
		assert.Contains(t, r.stdout, "redsem:{sched}:"+k+" (")
	}
	assert.NotContains(t, r.stdout, "including", "every key has its layout's type")

	aCmd := int(readInt(e.dir, "A.pid"))
	assert.Equal(t, exitLost, a.wait(t, 20*time.Second), "stderr %s", a.stderr)
	assert.False(t, alive(aCmd), "A's command was stopped")
	r = e.run(t, "status", "sched")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"sched" does not exist`)
}
