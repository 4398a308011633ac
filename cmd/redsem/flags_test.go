//go:build unix

package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scanArgs reads flock's habits: bundled one-letter flags, a value glued to
// its letter, flags on both sides of NAME, "--", and a negative number as a
// positional.
func TestScanArgs(t *testing.T) {
	type vals struct {
		n, v, x bool
		w       time.Duration
		size    int
	}
	parse := func(args []string, stopAfter int) (vals, []string, []string, error) {
		fs := newFlagSet("run")
		var o vals
		var w durationValue
		fs.BoolVar(&o.n, "n", false, "")
		fs.BoolVar(&o.v, "v", false, "")
		fs.BoolVar(&o.x, "x", false, "")
		fs.Var(&w, "w", "")
		fs.IntVar(&o.size, "size", 1, "")
		pos, rest, err := scanArgs(fs, args, "HELP", stopAfter)
		o.w = w.d
		return o, pos, rest, err
	}
	for _, tc := range []struct {
		args      string
		stopAfter int
		want      vals
		pos, rest []string
	}{
		{"-nw 5 job -- cmd a", 1, vals{n: true, w: 5 * time.Second, size: 1}, []string{"job"}, []string{"cmd", "a"}},
		{"-nw5 job cmd", 1, vals{n: true, w: 5 * time.Second, size: 1}, []string{"job"}, []string{"cmd"}},
		{"-vxn job -- cmd", 1, vals{n: true, v: true, x: true, size: 1}, []string{"job"}, []string{"cmd"}},
		{"job --size=3 -w 2m cmd -n", 1, vals{w: 2 * time.Minute, size: 3}, []string{"job"}, []string{"cmd", "-n"}},
		{"-size 4 job -- cmd", 1, vals{size: 4}, []string{"job"}, []string{"cmd"}},
		{"-- echo hi", 1, vals{size: 1}, nil, []string{"echo", "hi"}},
		{"job -2", -1, vals{size: 1}, []string{"job", "-2"}, nil},
		{"job -n -- -x", -1, vals{n: true, size: 1}, []string{"job", "-x"}, nil},
	} {
		got, pos, rest, err := parse(strings.Fields(tc.args), tc.stopAfter)
		require.NoError(t, err, tc.args)
		assert.Equal(t, tc.want, got, tc.args)
		assert.Equal(t, tc.pos, pos, tc.args)
		assert.Equal(t, tc.rest, rest, tc.args)
	}
	for args, msg := range map[string]string{
		"-nq job":    "unknown flag -q in -nq",
		"--nw job":   "unknown flag --nw",
		"-wn job":    `invalid value "n" for -w`,
		"job -w":     "flag -w needs a value",
		"-nw":        "flag -w needs a value",
		"--size x j": `invalid value "x" for --size`,
	} {
		_, _, _, err := parse(strings.Fields(args), 1)
		require.Error(t, err, args)
		assert.Contains(t, err.Error(), msg, args)
		assert.Equal(t, exitUsage, codeFor(err), args)
	}
	for _, h := range []string{"-h", "--help", "-help"} {
		_, _, _, err := parse([]string{"job", h}, 1)
		var hr *helpRequest
		require.ErrorAs(t, err, &hr, h)
	}
}

// The habits of flock users, run for real: -x/--exclusive accepted,
// bundled short flags, --version; "resize NAME -2" is a bad N, not a bad
// flag; "run -- COMMAND" without NAME is a usage error that writes nothing.
func TestFlockHabits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, args := range [][]string{
		{"run", "-x", "habits", "--", "true"},
		{"run", "--exclusive", "habits", "--", "true"},
		{"run", "-nw", "5", "habits", "--", "true"},
		{"run", "-xnw5", "habits", "--", "true"},
		{"run", "habits", "-nv", "--", "true"},
	} {
		r := e.run(t, args...)
		assert.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
	}

	for _, v := range []string{"--version", "-V", "version"} {
		r := e.run(t, v)
		assert.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, regexp.MustCompile(`^redsem (\(devel\)|v\S+)\n$`), r.stdout, v)
		assert.Empty(t, r.stderr)
	}

	r := e.run(t, "resize", "habits", "-2")
	assert.Equal(t, exitUsage, r.code)
	assert.Equal(t, "redsem: resize: N must be a whole number from 1 to 10000, not \"-2\"\n", r.stderr)

	c, err := redis.Dial("tcp", e.srv.Addr, redis.DialDatabase(2))
	require.NoError(t, err)
	defer c.Close()
	before, err := redis.Strings(c.Do("KEYS", "*"))
	require.NoError(t, err)
	for _, args := range [][]string{
		{"run", "--", "echo", "hi"},
		{"run", "-n", "--", "echo", "hi"},
		{"run", "--size", "2", "--", "echo"},
	} {
		r := e.run(t, args...)
		assert.Equal(t, exitUsage, r.code, "%v", args)
		assert.Contains(t, r.stderr, "missing NAME", "%v", args)
		assert.Empty(t, r.stdout, "%v: the command did not run", args)
	}
	after, err := redis.Strings(c.Do("KEYS", "*"))
	require.NoError(t, err)
	assert.ElementsMatch(t, before, after, "no semaphore created")
	assert.NotContains(t, strings.Join(after, " "), "{echo}")
}
