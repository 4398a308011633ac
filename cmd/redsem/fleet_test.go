//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// fleetPool is a pool on the test's database.
func fleetPool(t *testing.T, e *env) *redis.Pool {
	p := &redis.Pool{Dial: func() (redis.Conn, error) {
		return redis.Dial("tcp", e.srv.Addr, redis.DialDatabase(2))
	}}
	t.Cleanup(func() { p.Close() })
	return p
}

// makeFleet creates, under the default prefix: "lock" (a mutex, held, one
// waiter), "full" (2 of 2 held), "half" (2 of 4), "api" (a rate gate, 3 of
// 10 per minute started) and "idle" (0 of 3). By saturation, then waiters,
// that is the order top shows.
func makeFleet(t *testing.T, e *env) *redis.Pool {
	t.Helper()
	pool := fleetPool(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hold := func(name string, size, n int) {
		s, err := redsem.NewSemaphore(pool, name, size, redsem.WithFixedTTL())
		require.NoError(t, err)
		for i := 0; i < n; i++ {
			_, err := s.TryAcquire(ctx)
			require.NoError(t, err)
		}
		if n == 0 {
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))
		}
	}
	hold("lock", 1, 1)
	hold("full", 2, 2)
	hold("half", 4, 2)
	hold("idle", 3, 0)
	g, err := rate.New(pool, "api", 10, time.Minute)
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		_, err := g.Allow(ctx)
		require.NoError(t, err)
	}
	// A waiter registered on "lock", as a blocked Acquire registers itself.
	c := pool.Get()
	defer c.Close()
	_, err = c.Do("ZADD", "redsem:{lock}:waits", time.Now().Add(time.Hour).UnixMilli(), "w:someone")
	require.NoError(t, err)
	return pool
}

var rowName = regexp.MustCompile(`(?m)^(\S+)\s+(sem|mutex|rw|rate)\s`)

// topOrder returns the names of the first block of top's output, in order.
func topOrder(out string) []string {
	block, _, _ := strings.Cut(out, "\n\n")
	var names []string
	for _, m := range rowName.FindAllStringSubmatch(block, -1) {
		names = append(names, m[1])
	}
	return names
}

func TestTopPlainLines(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	makeFleet(t, e)
	r := e.run(t, "top", "-n", "2", "--interval", "50ms")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Empty(t, r.stderr)
	assert.NotContains(t, r.stdout, "\x1b[", "no terminal escapes into a pipe")
	assert.Equal(t, 2, strings.Count(r.stdout, "redsem top "), "one block per refresh:\n%s", r.stdout)
	assert.Contains(t, r.stdout, "prefix \"redsem:\"  4 semaphores, 1 rate gate\n")
	assert.Equal(t, []string{"lock", "full", "half", "api", "idle"}, topOrder(r.stdout), r.stdout)
	fields := func(name string) []string {
		m := regexp.MustCompile(`(?m)^` + name + `\s.*$`).FindString(r.stdout)
		return strings.Fields(m)
	}
	// NAME KIND HELD SIZE SAT WAIT FREE EXP STRAY OLDEST
	assert.Equal(t, []string{"half", "sem", "2", "4", "50%", "0", "2", "0", "0"}, fields("half")[:9])
	assert.Equal(t, []string{"lock", "mutex", "1", "1", "100%", "1", "0", "0", "0"}, fields("lock")[:9])
	assert.Equal(t, []string{"api", "rate", "3", "10", "30%", "0", "7", "-", "0", "per", "1m"}, fields("api"))
	assert.Equal(t, []string{"idle", "sem", "0", "3", "0%", "0", "3", "0", "0", "-"}, fields("idle"))
}

// A refresh whose read fails keeps the last fleet on screen, under the
// error, rather than blanking it.
func TestTopKeepsLastFleetOnError(t *testing.T) {
	var out strings.Builder
	view := &topView{w: &out, prefix: "redsem:", shown: "redis://x"}
	fl := admin.Fleet{Semaphores: []admin.Status{{Name: "kept", Exists: true, Size: 2}}}
	reads := 0
	view.run(context.Background(), fl, func() (admin.Fleet, error) {
		reads++
		return admin.Fleet{}, errors.New("connection refused")
	}, time.Millisecond, 2)
	require.Equal(t, 1, reads)
	blocks := strings.Split(strings.TrimSpace(out.String()), "\n\n")
	require.Len(t, blocks, 2, out.String())
	assert.Contains(t, blocks[1], "error: connection refused")
	assert.Contains(t, blocks[1], "  1 semaphore\n", "the last fleet stays:\n%s", blocks[1])
	assert.Equal(t, []string{"kept"}, topOrder(blocks[1]), blocks[1])
}

// Under a pseudo-terminal top redraws in place: cursor hidden, drawn from
// the top left, cursor shown again at the end.
func TestTopUnderPTY(t *testing.T) {
	t.Parallel()
	script := redistest.Tool(t, "script", "apt-get install util-linux")
	e := newEnv(t)
	makeFleet(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// 60 columns: narrower than the header, which must not wrap.
	cmd := exec.CommandContext(ctx, script, "-q", "-e", "-c", "stty cols 60 rows 40; exec "+bin+" top -n 3 --interval 50ms", "/dev/null")
	cmd.Env = append(cleanEnv(), "REDIS_URL="+e.url, "TERM=xterm")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), out.String())
	s := out.String()
	assert.True(t, strings.HasPrefix(s, "\x1b[?25l\x1b[H\x1b[2J"), "starts by hiding the cursor and clearing: %q", s[:min(40, len(s))])
	assert.Equal(t, 3, strings.Count(s, "\x1b[J"), "three frames, each drawn over the last")
	assert.True(t, strings.HasSuffix(strings.TrimRight(s, "\r\n"), "\x1b[?25h"), "ends by showing the cursor: %q", s[max(0, len(s)-40):])
	frames := strings.Split(s, "\x1b[H")
	last := frames[len(frames)-1]
	plain := strings.ReplaceAll(regexp.MustCompile(`\x1b\[[0-9;?]*[a-zA-Z]`).ReplaceAllString(last, ""), "\r", "")
	assert.Equal(t, []string{"lock", "full", "half", "api", "idle"}, topOrder(plain), plain)
	for _, l := range strings.Split(strings.TrimRight(plain, "\n"), "\n") {
		assert.Less(t, len([]rune(l)), 60, "a line as wide as the terminal wraps: %q", l)
	}
	assert.True(t, strings.HasPrefix(plain, "redsem top ") && strings.Contains(plain, "…\n"), "the header is cut: %q", plain)
}

// Every column of top is as wide as its widest value: a row's HELD ends
// where the header's does, for every kind (mutex is the longest); the header
// counts with singulars and leaves out kinds that are not there.
func TestTopColumns(t *testing.T) {
	var out strings.Builder
	view := &topView{w: &out, prefix: "redsem:", shown: "redis://x"}
	view.show(admin.Fleet{
		Semaphores: []admin.Status{{Name: "m", Exists: true, Size: 1}, {Name: "encoders", Exists: true, Size: 4}},
		RWMutexes:  []admin.RWStatus{{Name: "backup", Exists: true}},
	}, nil, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5, out.String())
	assert.Equal(t, `redsem top  03:04:05  redis://x  prefix "redsem:"  2 semaphores, 1 lock`, lines[0])
	held := strings.Index(lines[1], "HELD") + len("HELD")
	for _, row := range lines[2:] {
		m := regexp.MustCompile(`^\S+\s+\S+\s+\S+`).FindString(row)
		assert.Equal(t, held, len(m), "HELD ends at column %d:\n%s\n%s", held, lines[1], row)
	}
}

func TestTopBadArguments(t *testing.T) {
	t.Parallel()
	e := &env{url: "redis://127.0.0.1:1", dir: t.TempDir()}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"top", "extra"}, exitUsage},
		{[]string{"top", "-n", "-1"}, exitUsage},
		{[]string{"top", "--interval", "1ms"}, exitUsage},
		{[]string{"top", "--limit", "0"}, exitUsage},
		{[]string{"top", "--max-scan", "0"}, exitUsage},
		{[]string{"top", "--prefix", "a{"}, exitUsage},
		{[]string{"top", "-n", "1"}, exitUnavailable},
		{[]string{"check", "--all", "extra"}, exitUsage},
		{[]string{"check", "--all", "--limit", "0"}, exitUsage},
		{[]string{"check", "--all", "--max-scan", "0"}, exitUsage},
		{[]string{"check", "--all"}, exitUnavailable},
	} {
		r := e.run(t, tc.args...)
		assert.Equal(t, tc.code, r.code, "%v: %s", tc.args, r.stderr)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "%v: one line: %q", tc.args, r.stderr)
		assert.Empty(t, r.stdout, "%v", tc.args)
	}
	for _, args := range [][]string{{"top", "--help"}, {"check", "--all", "--help"}, {"help", "top"}, {"help", "exporter"}} {
		r := e.run(t, args...)
		assert.Equal(t, 0, r.code, "%v", args)
		assert.Contains(t, r.stdout, "Usage:", "%v", args)
	}
}

// check --all is silent and exits 0 on a healthy fleet, and prints one line
// per unhealthy semaphore (and one per unreadable name) with exit 65.
func TestCheckAll(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := makeFleet(t, e)
	r := e.run(t, "check", "--all")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Empty(t, r.stdout)
	assert.Empty(t, r.stderr)
	r = e.run(t, "check", "--all", "-v")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "5 names under \"redsem:\" checked, all healthy\n", r.stdout, "-v says what was checked")

	c := pool.Get()
	defer c.Close()
	for _, cmd := range [][]interface{}{
		{"LPOP", "redsem:{idle}:tokens"},          // a slot missing
		{"RPUSH", "redsem:{half}:tokens", "junk"}, // a stranger
		{"SET", "redsem:{bad}:meta", "a string"},  // unreadable
	} {
		_, err := c.Do(cmd[0].(string), cmd[1:]...)
		require.NoError(t, err)
	}
	r = e.run(t, "check", "--all")
	assert.Equal(t, exitData, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 3, r.stdout)
	assert.True(t, strings.HasPrefix(lines[0], `"bad": semaphore: cannot check: `), lines[0])
	assert.True(t, strings.HasPrefix(lines[1], `"half": semaphore, size 4,`), lines[1])
	assert.Contains(t, lines[1], "strangers 1")
	assert.True(t, strings.HasSuffix(lines[1], ": unhealthy"), lines[1])
	assert.True(t, strings.HasPrefix(lines[2], `"idle": semaphore, size 3,`), lines[2])
	assert.Contains(t, lines[2], "missing slot ")
	assert.Equal(t, "redsem: check --all: 3 of 6 names under \"redsem:\" unhealthy\n", r.stderr)

	// Another prefix holds nothing: healthy.
	r = e.run(t, "check", "--all", "--prefix", "other:")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Empty(t, r.stdout)
	r = e.run(t, "check", "--all", "--verbose", "--prefix", "other:")
	assert.Equal(t, "0 names under \"other:\" checked, all healthy\n", r.stdout)

	// The cap on names is said on stderr.
	r = e.run(t, "check", "--all", "--limit", "1")
	assert.Contains(t, r.stderr, "raise --limit")
}

// top and check --all send at most --max-scan SCAN calls (default
// admin.DefaultMaxScan) and say when that cut the scan short.
func TestFleetMaxScan(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := makeFleet(t, e)
	c := pool.Get()
	defer c.Close()
	// 20,000 keys of another program: about 40 SCAN calls of COUNT 500.
	_, err := c.Do("DEBUG", "POPULATE", 20000, "other")
	require.NoError(t, err)

	e.srv.Do(t, "CONFIG", "RESETSTAT")
	r := e.run(t, "top", "-n", "1", "--max-scan", "3")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "scan incomplete: raise --limit or --max-scan")
	assert.Equal(t, 3, e.srv.CommandCalls(t)["scan"])

	e.srv.Do(t, "CONFIG", "RESETSTAT")
	r = e.run(t, "top", "-n", "1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.NotContains(t, r.stdout, "scan incomplete")
	assert.Equal(t, []string{"lock", "full", "half", "api", "idle"}, topOrder(r.stdout), r.stdout)
	scans := e.srv.CommandCalls(t)["scan"]
	assert.Greater(t, scans, 3)
	assert.LessOrEqual(t, scans, admin.DefaultMaxScan)

	e.srv.Do(t, "CONFIG", "RESETSTAT")
	r = e.run(t, "check", "--all", "--max-scan", "3")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stderr, "more may exist (raise --limit 1000 or --max-scan 3)")
	assert.Equal(t, 3, e.srv.CommandCalls(t)["scan"])

	r = e.run(t, "check", "--all")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Empty(t, r.stderr)
}

// An election is a kind of its own in the fleet: check --all finds it
// healthy (it has no token inventory of a semaphore), top shows its leader
// and waiting campaigners, top --json and status --json its term, value and
// the time its lease has left.
func TestFleetShowsElections(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := fleetPool(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	el, err := redsem.NewElection(pool, "sched", redsem.WithLabel("host-a"))
	require.NoError(t, err)
	lead, err := el.Campaign(ctx, "host-a")
	require.NoError(t, err)
	defer lead.Resign(ctx)
	other, err := redsem.NewElection(pool, "sched", redsem.WithWaitConnections(0))
	require.NoError(t, err)
	wctx, wcancel := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() { defer close(waited); _, _ = other.Campaign(wctx, "host-b") }()
	defer func() { wcancel(); <-waited }()
	h, err := admin.New(pool, redsem.DefaultPrefix, "sched")
	require.NoError(t, err)
	require.Eventually(t, func() bool { st, err := h.ElectionStatus(ctx); return err == nil && st.Waiting == 1 },
		10*time.Second, 5*time.Millisecond)

	r := e.run(t, "check", "--all", "--json")
	assert.Equal(t, 0, r.code, "stdout %s stderr %s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, `"checked": 1`, "the election was checked, as an election")
	r = e.run(t, "top", "-n", "1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "prefix \"redsem:\"  1 election\n")
	assert.Regexp(t, `(?m)^sched\s+elect\s+1\s+-\s+100%\s+1\s`, r.stdout)
	r = e.run(t, "top", "--json", "-n", "1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"kind": "election"`)
	assert.Contains(t, r.stdout, `"value": "host-a"`)
	assert.Contains(t, r.stdout, fmt.Sprintf(`"term": %d`, lead.Term()))
	var fl struct {
		Names []struct {
			Leader *struct {
				TTLLeftMs int64 `json:"ttl_left_ms"`
				Expired   bool  `json:"expired"`
			} `json:"leader"`
		} `json:"names"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &fl), r.stdout)
	require.Len(t, fl.Names, 1)
	require.NotNil(t, fl.Names[0].Leader, r.stdout)
	// The leader refreshes its 30s lease: its deadline is seconds away.
	assert.Greater(t, fl.Names[0].Leader.TTLLeftMs, int64(1000), r.stdout)
	assert.False(t, fl.Names[0].Leader.Expired, r.stdout)
	r = e.run(t, "status", "--json", "sched")
	require.Equal(t, 0, r.code, r.stderr)
	var st struct {
		Leader *struct {
			TTLLeftMs int64 `json:"ttl_left_ms"`
		} `json:"leader"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	require.NotNil(t, st.Leader, r.stdout)
	assert.Greater(t, st.Leader.TTLLeftMs, int64(1000), "status --json: %s", r.stdout)
}
