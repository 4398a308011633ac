//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
)

// kindsFleet makes one name of every kind, under the default prefix: "enc"
// (a semaphore of 3, one slot held), "job" (a mutex), "backup" (the lock
// redsem run NAME takes, held by a helper) and "api" (a rate gate made by
// rate set). It returns the helper's pid.
func kindsFleet(t *testing.T, e *env) int {
	t.Helper()
	for _, args := range [][]string{
		{"resize", "--create", "enc", "3"}, {"resize", "--create", "job", "1"}, {"rate", "set", "--create", "api", "5/s"},
	} {
		r := e.run(t, args...)
		require.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
	}
	pool := fleetPool(t, e)
	c := pool.Get()
	defer c.Close()
	_, err := c.Do("ZADD", "redsem:{enc}:waits", time.Now().Add(time.Hour).UnixMilli(), "w:someone")
	require.NoError(t, err)
	e.start(t, helperEnvFor(), append([]string{"run", "backup"}, helperArgs()...)...)
	return waitHelper(t, e.dir, "child")
}

// status, check, reclaim, repair, resize and delete on every kind: each
// says the kind, acts where the action applies, and refuses clearly (exit
// 65, the reason and what to do) where it does not.
func TestEveryKindOneView(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kindsFleet(t, e)

	for name, head := range map[string]string{
		"enc": "semaphore  enc\n", "job": "mutex      job\n", "backup": "rwmutex    backup\n", "api": "rate       api\n",
	} {
		r := e.run(t, "status", name)
		require.Equal(t, 0, r.code, "%s: %s", name, r.stderr)
		assert.True(t, strings.HasPrefix(r.stdout, head), "%s:\n%s", name, r.stdout)
	}
	r := e.run(t, "status", "api")
	assert.Contains(t, r.stdout, "limit      5 per 1s\n", "a rate gate set from the shell has a view")

	// top shows the lock too: held by a writer, saturated.
	r = e.run(t, "top", "-n", "1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "2 semaphores, 1 lock, 1 rate gate\n")
	assert.Equal(t, []string{"backup", "rw", "1", "-", "100%", "0", "-", "0", "0"},
		strings.Fields(regexp.MustCompile(`(?m)^backup\s.*$`).FindString(r.stdout))[:9], r.stdout)

	for name, want := range map[string]string{
		"enc":    `"enc": semaphore, size 3, free 3, pending 0, leased 0, withheld 0, retired 0, duplicates 0, strangers 0, missing none: healthy`,
		"job":    `"job": mutex, size 1, free 1,`,
		"backup": `"backup": rwmutex, readers 0, writer 1, waiting 0, expired 0: healthy`,
		"api":    `"api": rate, 5 per 1s, started 0, due 0, available 5, waiting 0, stray 0: healthy`,
	} {
		r := e.run(t, "check", name)
		assert.Equal(t, 0, r.code, "%s: %s", name, r.stderr)
		assert.Contains(t, r.stdout, want, name)
	}

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"resize", "backup", "3"}, `redsem: resize: "backup" is a read-write lock: a lock has no size`},
		{[]string{"resize", "api", "3"}, `redsem: resize: "api" is a rate gate: change its limits with redsem rate set api N/PER`},
		{[]string{"repair", "backup"}, `redsem: repair: "backup" is a read-write lock: repair applies to a semaphore or mutex`},
		{[]string{"repair", "api"}, `redsem: repair: "api" is a rate gate: repair applies to a semaphore or mutex`},
		{[]string{"reclaim", "backup"}, `redsem: reclaim: "backup" is a read-write lock: its expired leases go at its next lock`},
		{[]string{"reclaim", "api"}, `redsem: reclaim: "api" is a rate gate: its starts leave the window by themselves`},
	} {
		r := e.run(t, tc.args...)
		assert.Equal(t, exitData, r.code, "%v: %s", tc.args, r.stderr)
		assert.True(t, strings.HasPrefix(r.stderr, tc.msg), "%v: %s", tc.args, r.stderr)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "%v", tc.args)
		assert.Empty(t, r.stdout, "%v", tc.args)
	}
	// The refusals changed nothing: no semaphore appeared beside the lock.
	r = e.run(t, "status", "--json", "backup")
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	assert.Equal(t, "rwmutex", doc["kind"])
	assert.Equal(t, []any{"rwmutex"}, doc["kinds"])

	// What applies does: reclaim and repair of the semaphore and the mutex.
	for _, args := range [][]string{{"reclaim", "enc"}, {"repair", "job"}, {"resize", "enc", "4"}} {
		r := e.run(t, args...)
		assert.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
	}

	// resize --create beside a lock is asked for: status then names both.
	r = e.run(t, "resize", "--create", "backup", "2")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "status", "backup")
	assert.True(t, strings.HasPrefix(r.stdout, "semaphore  backup\n"), r.stdout)
	assert.Contains(t, r.stdout, `"backup" also names a read-write lock (--kind rwmutex)`)
	r = e.run(t, "status", "--kind", "rwmutex", "backup")
	assert.True(t, strings.HasPrefix(r.stdout, "rwmutex    backup\n"), r.stdout)
	r = e.run(t, "check", "--json", "--kind", "rw", "backup")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
	assert.Equal(t, "rwmutex", doc["kind"])

	// delete says what it would remove, then removes every kind.
	r = e.run(t, "delete", "backup")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, `"backup" is a semaphore of size 2 with 0 holder(s) and 0 waiter(s) and a read-write lock with 1 holder(s) and 0 waiter(s)`)
	r = e.run(t, "delete", "--force", "backup")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^deleted "backup": semaphore \(\d+ keys\), rwmutex \(\d+ keys?\)\n$`, r.stdout)
	r = e.run(t, "delete", "--force", "api")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^deleted "api": rate \(\d+ keys?\)\n$`, r.stdout)
}

// A name that does not exist is exit 66 for every command but status,
// which says so and exits 0; resize makes nothing unless --create.
func TestNoSuchNameExits66(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, args := range [][]string{
		{"check", "nosuch"}, {"check", "--json", "nosuch"}, {"repair", "nosuch"}, {"reclaim", "nosuch"},
		{"resize", "nosuch", "3"}, {"delete", "nosuch"}, {"delete", "--force", "nosuch"},
	} {
		r := e.run(t, args...)
		assert.Equal(t, exitNoName, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stderr, `"nosuch"`, "%v", args)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "%v", args)
		assert.Empty(t, r.stdout, "%v", args)
	}
	r := e.run(t, "resize", "nosuch", "3")
	assert.Contains(t, r.stderr, "resize --create nosuch 3 makes one")
	r = e.run(t, "status", "nosuch")
	assert.Equal(t, 0, r.code)
	assert.Equal(t, "\"nosuch\" does not exist (no semaphore, mutex, read-write lock, rate gate or election of that name under prefix \"redsem:\")\n", r.stdout)
	r = e.run(t, "rate", "status", "nosuch")
	assert.Equal(t, 0, r.code)
	assert.Equal(t, "\"nosuch\" does not exist (no rate gate of that name under prefix \"redsem:\")\n", r.stdout)
	n, err := redis.Int(fleetPool(t, e).Get().Do("DBSIZE"))
	require.NoError(t, err)
	assert.Zero(t, n, "a typo made nothing")

	r = e.run(t, "resize", "--create", "nosuch", "3")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "check", "nosuch")
	assert.Equal(t, 0, r.code, r.stderr)
}

// Rate gates from the shell: the limit forms, rate status, status of a
// gate, and run --rate holding a cron job to N starts per period across
// processes.
func TestRateFromShell(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for in, out := range map[string]string{
		"5/s": "5 per 1s", "5/1s": "5 per 1s", "100/1m": "100 per 1m", "20/250ms": "20 per 250ms", "3/h": "3 per 1h", "7/1m30s": "7 per 1m30s",
	} {
		name := "g" + strings.NewReplacer("/", "-").Replace(in)
		r := e.run(t, "rate", "set", "--create", name, in)
		assert.Equal(t, 0, r.code, "%s: %s", in, r.stderr)
		assert.Equal(t, "created rate gate \""+name+"\", which admits "+out+"\n", r.stdout, in)
		r = e.run(t, "rate", "status", name)
		assert.Contains(t, r.stdout, "limit      "+out+"\n", in)
	}
	for _, bad := range []string{"5", "5/", "x/s", "5/x", "0/s", "5/0s"} {
		r := e.run(t, "rate", "set", "bad", bad)
		assert.Equal(t, exitUsage, r.code, bad)
		assert.Contains(t, r.stderr, `"`+bad+`" is not a limit N/PER such as 5/s, 100/1m or 20/250ms`, bad)
	}

	r := e.run(t, "rate", "status", "--json", "g5-s")
	require.Equal(t, 0, r.code, r.stderr)
	var st rateStatusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	assert.Equal(t, rateStatusJSON{Kind: "rate", Name: "g5-s", Exists: true, Limit: 5, PerMs: 1000, Available: 5, Set: true,
		Limits: []limitJSON{{N: 5, PerMs: 1000, Available: 5}}, Kinds: []string{"rate"}},
		rateStatusJSON{Kind: st.Kind, Name: st.Name, Exists: st.Exists, Limit: st.Limit, PerMs: st.PerMs, Available: st.Available,
			Set: st.Set, Limits: st.Limits, Kinds: st.Kinds})

	// Three cron jobs on a 2/1s gate, started together: two start at once,
	// the third a second after the first.
	var procs []*exec.Cmd
	var outs []*bytes.Buffer
	for i := 0; i < 3; i++ {
		cmd := e.command(context.Background(), "run", "--rate", "2/s", "cron", "-c", `echo "$REDSEM_RATE_AT"`)
		var out bytes.Buffer
		cmd.Stdout = &out
		require.NoError(t, cmd.Start())
		procs, outs = append(procs, cmd), append(outs, &out)
	}
	var ats []time.Time
	for i, cmd := range procs {
		require.NoError(t, cmd.Wait())
		at, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(outs[i].String()))
		require.NoError(t, err, outs[i].String())
		ats = append(ats, at)
	}
	sort.Slice(ats, func(i, j int) bool { return ats[i].Before(ats[j]) })
	// Redis's start times: the first two share a window when the three
	// processes start within one (not judged: a loaded machine starts them
	// later), the third never does.
	t.Logf("starts %v and %v after the first", ats[1].Sub(ats[0]), ats[2].Sub(ats[0]))
	assert.GreaterOrEqual(t, ats[2].Sub(ats[0]), time.Second, "the third waited for the first to leave it")
	r = e.run(t, "status", "cron")
	assert.Contains(t, r.stdout, "rate       cron\n")

	// -n: no start now is busy (exit 1, or -E); -v says when the next is.
	r = e.run(t, "rate", "set", "--create", "slow", "1/1h")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "run", "--rate", "1/h", "-n", "slow", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "run", "--rate", "1/h", "-n", "-v", "slow", "--", "true")
	assert.Equal(t, exitBusy, r.code)
	assert.Contains(t, r.stderr, `no start now under rate gate "slow" (1 per 1h); the next in `)
	r = e.run(t, "run", "--rate", "1/h", "-w", "0.2", "-E", "9", "slow", "--", "true")
	assert.Equal(t, 9, r.code)

	// Another rate than the stored one before any rate set, and a lock
	// flag beside --rate.
	r = e.run(t, "run", "--rate", "3/s", "fresh", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "run", "--rate", "4/s", "fresh", "--", "true")
	assert.Equal(t, exitData, r.code)
	assert.Contains(t, r.stderr, "redsem rate set changes them")
	r = e.run(t, "run", "--rate", "4/s", "-s", "fresh", "--", "true")
	assert.Equal(t, exitUsage, r.code)

	// With --size: a slot and a start; the command sees both.
	r = e.run(t, "run", "--rate", "5/s", "--size", "2", "both", "-c", `echo "$REDSEM_SLOT $REDSEM_RATE_AT"`)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^[12] \d{4}-`, r.stdout)
	r = e.run(t, "status", "--json", "both")
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	assert.Equal(t, []any{"semaphore", "rate"}, doc["kinds"])
	assert.Equal(t, float64(2), doc["available"], "the slot was given back")
}

// Every JSON document shares one schema: "kind", "name" and "exists" in
// each document about a name, snake_case keys, no null; top -n 1 --json and
// check --all --json are reports of those documents.
func TestOneJSONSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kindsFleet(t, e)
	kindOf := map[string]string{"enc": "semaphore", "job": "mutex", "backup": "rwmutex", "api": "rate"}
	for name, kind := range kindOf {
		for _, args := range [][]string{{"status", "--json", name}, {"check", "--json", name}} {
			r := e.run(t, args...)
			require.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
			var doc map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
			checkJSONStyle(t, strings.Join(args, " "), doc)
			assert.Equal(t, kind, doc["kind"], "%v", args)
			assert.Equal(t, name, doc["name"], "%v", args)
			assert.Equal(t, true, doc["exists"], "%v", args)
		}
	}
	r := e.run(t, "rate", "status", "--json", "api")
	var rs map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rs))
	r = e.run(t, "status", "--json", "api")
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	delete(rs, "server_time")
	delete(st, "server_time")
	assert.Equal(t, st, rs, "rate status --json is status --json of the gate")

	r = e.run(t, "top", "-n", "1", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var fl struct {
		Prefix string           `json:"prefix"`
		Names  []map[string]any `json:"names"`
		Failed []any            `json:"failed"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &fl), r.stdout)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw))
	checkJSONStyle(t, "top --json", raw)
	assert.Equal(t, "redsem:", fl.Prefix)
	got := map[string]string{}
	for _, d := range fl.Names {
		got[d["name"].(string)] = d["kind"].(string)
	}
	assert.Equal(t, kindOf, got)
	for _, d := range fl.Names {
		r := e.run(t, "status", "--json", d["name"].(string))
		var one map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &one))
		assert.ElementsMatch(t, keysOf(one), keysOf(d), "top's document of %s is status's", d["name"])
	}

	r = e.run(t, "check", "--all", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	raw = nil
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw))
	checkJSONStyle(t, "check --all --json", raw)
	assert.Equal(t, map[string]any{"prefix": "redsem:", "checked": float64(4), "healthy": true, "truncated": false, "unhealthy": []any{}}, raw)

	c := fleetPool(t, e).Get()
	defer c.Close()
	_, err := c.Do("LPOP", "redsem:{enc}:tokens")
	require.NoError(t, err)
	_, err = c.Do("SET", "redsem:{bad}:rate:meta", "x")
	require.NoError(t, err)
	r = e.run(t, "check", "--all", "--json")
	assert.Equal(t, exitData, r.code)
	var rep struct {
		Healthy   bool             `json:"healthy"`
		Unhealthy []map[string]any `json:"unhealthy"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
	assert.False(t, rep.Healthy)
	require.Len(t, rep.Unhealthy, 2)
	assert.Equal(t, "semaphore", rep.Unhealthy[0]["kind"])
	assert.Equal(t, "enc", rep.Unhealthy[0]["name"])
	assert.Equal(t, []any{float64(1)}, rep.Unhealthy[0]["missing"])
	assert.Equal(t, "rate", rep.Unhealthy[1]["kind"])
	assert.Contains(t, rep.Unhealthy[1]["error"], "wrong type")
}

func keysOf(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// goSyntax is what Go prints for values that plain output must not show:
// slices ([] or [1 2]), maps, pointers to structs.
var goSyntax = regexp.MustCompile(`\[\]|\[\d+( \d+)*\]|map\[|&\{|%!`)

// Plain output speaks without Go syntax, and a bad flag value is named with
// its flag, without Go's parser in the message.
func TestPlainOutputAndFlagErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kindsFleet(t, e)
	c := fleetPool(t, e).Get()
	defer c.Close()
	_, err := c.Do("LPOP", "redsem:{enc}:tokens")
	require.NoError(t, err)
	for _, args := range [][]string{{"check", "enc"}, {"repair", "enc"}, {"check", "--all"}, {"check", "backup"}, {"check", "api"}} {
		r := e.run(t, args...)
		assert.NotRegexp(t, goSyntax, r.stdout+r.stderr, "%v", args)
	}
	r := e.run(t, "check", "enc")
	assert.Contains(t, r.stdout, "missing none", "repaired")

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"run", "--size", "two", "x", "--", "true"}, `redsem: run: invalid value "two" for --size: not a whole number`},
		{[]string{"run", "-E", "x", "x", "--", "true"}, `redsem: run: invalid value "x" for -E: not a whole number`},
		{[]string{"run", "--rate", "5/x", "x", "--", "true"}, `redsem: run: invalid value "5/x" for --rate: not a limit N/PER such as 5/s, 100/1m or 20/250ms: PER "x" is not a duration`},
		{[]string{"top", "--limit", "lots"}, `redsem: top: invalid value "lots" for --limit: not a whole number`},
		{[]string{"check", "--kind", "queue", "x"}, `redsem: check: invalid value "queue" for --kind: not a kind`},
		{[]string{"status", "--json=maybe", "x"}, `redsem: status: invalid value "maybe" for --json: not true or false`},
		{[]string{"top", "--interval", "1ms"}, `redsem: top: --interval must be at least 10ms, not 1ms`},
	} {
		r := e.run(t, tc.args...)
		assert.Equal(t, exitUsage, r.code, "%v", tc.args)
		assert.True(t, strings.HasPrefix(r.stderr, tc.msg), "%v: %s", tc.args, r.stderr)
		assert.NotContains(t, r.stderr, "strconv", "%v", tc.args)
		assert.NotContains(t, r.stderr, "parse error", "%v", tc.args)
	}
}

// q quits redsem top on a terminal, and so does Ctrl-C; the cursor comes
// back either way.
func TestTopQuitsOnQAndCtrlC(t *testing.T) {
	t.Parallel()
	script := redistest.Tool(t, "script", "apt-get install util-linux")
	e := newEnv(t)
	makeFleet(t, e)
	for _, key := range []string{"q", "\x03"} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, script, "-q", "-e", "-c", "exec "+bin+" top --interval 50ms", "/dev/null")
		cmd.Env = append(cleanEnv(), "REDIS_URL="+e.url, "TERM=xterm")
		in, err := cmd.StdinPipe()
		require.NoError(t, err)
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		waitFor(t, 10*time.Second, "top's second frame", func() bool { return strings.Count(out.String(), "\x1b[J") >= 2 })
		_, err = io.WriteString(in, key)
		require.NoError(t, err)
		err = cmd.Wait()
		cancel()
		s := out.String()
		assert.NoError(t, err, "%q ends top normally (at once: else ctx kills it): %q", key, s[max(0, len(s)-200):])
		assert.Contains(t, s[max(0, len(s)-40):], "\x1b[?25h", "%q: the cursor is shown again", key)
	}
}

// syncBuffer is a bytes.Buffer safe to read while a process writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
