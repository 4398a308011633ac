//go:build unix

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/redistest"
)

// Every command of redsem runs as a Redis user allowed only
// admin.ACLCommands() on ~redsem:*, with SELECT added for the database the
// URL names: run (free, and blocked until a slot frees), --adopt-size,
// --rate, status, check, repair, resize, reclaim, delete (of every kind),
// rate set and rate status.
func TestCommandsAsACLUser(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	args := []interface{}{"SETUSER", "cli", "reset", "on", ">pw", "resetkeys", "~redsem:*", "resetchannels", "-@all", "+select"}
	for _, c := range admin.ACLCommands() {
		args = append(args, "+"+c)
	}
	srv.Do(t, "ACL", args...)
	e := &env{srv: srv, url: "redis://cli:pw@" + srv.Addr + "/2", dir: t.TempDir()}

	r := e.run(t, "run", "--size", "2", "acl", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	// A holder, then a second run that blocks until the holder is gone.
	holder := e.start(t, helperEnvFor(), append([]string{"run", "--size", "1", "--ttl", "2s", "one"}, helperArgs()...)...)
	pid := waitHelper(t, e.dir, "child")
	waiter := e.start(t, nil, "run", "--size", "1", "-w", "30", "one", "--", "true")
	waitFor(t, 10*time.Second, "the waiter to block", func() bool {
		r := e.run(t, "status", "--json", "one")
		var st statusJSON
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &st) == nil && st.Waiting == 1
	})
	require.NoError(t, syscall.Kill(pid, syscall.SIGTERM)) // the helper exits 5, redsem releases
	assert.Equal(t, 5, holder.wait(t, 20*time.Second), holder.stderr.String())
	assert.Equal(t, 0, waiter.wait(t, 20*time.Second), "the blocked run got the slot: %s", waiter.stderr)

	for _, tc := range []struct {
		args []string
		out  string
	}{
		{[]string{"resize", "acl", "1"}, "1 slot(s)"},
		{[]string{"run", "--size", "2", "--adopt-size", "acl", "--", "true"}, ""},
		{[]string{"status", "acl"}, "size       1"},
		{[]string{"check", "acl"}, "size 1"},
		{[]string{"repair", "acl"}, "minted 0"},
		{[]string{"reclaim", "acl"}, "reclaimed 0"},
		{[]string{"delete", "--force", "acl"}, "deleted"},
		{[]string{"delete", "--force", "one"}, "deleted"},
		{[]string{"rate", "set", "--create", "acl-rate", "5/1s"}, "admits 5 per 1s"},
		{[]string{"run", "--rate", "5/s", "acl-rate", "--", "true"}, ""},
		{[]string{"rate", "status", "acl-rate"}, "limit      5 per 1s"},
		{[]string{"check", "acl-rate"}, "rate, 5 per 1s"},
		{[]string{"run", "acl-lock", "--", "true"}, ""},
		{[]string{"status", "acl-lock"}, "rwmutex"},
		{[]string{"delete", "--force", "acl-rate"}, "deleted \"acl-rate\": rate ("},
		{[]string{"delete", "--force", "acl-lock"}, "deleted \"acl-lock\": rwmutex ("},
	} {
		r := e.run(t, tc.args...)
		assert.Equal(t, 0, r.code, "%v: %s", tc.args, r.stderr)
		assert.Contains(t, r.stdout, tc.out, "%v", tc.args)
		assert.NotContains(t, r.stderr, "NOPERM", "%v", tc.args)
	}
	c, err := redis.Dial("tcp", srv.Addr, redis.DialDatabase(2))
	require.NoError(t, err)
	defer c.Close()
	keys, err := redis.Strings(c.Do("KEYS", "*"))
	require.NoError(t, err)
	assert.Empty(t, keys, "delete removed everything")
}

// The fleet commands need SCAN, which admin.ACLCommands() leaves out: as
// that user, top, check --all and the exporter fail with Redis's NOPERM and
// say to allow +scan; with +scan they see the fleet.
func TestFleetCommandsAsACLUser(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	setUser := func(user string, extra ...string) string {
		args := []interface{}{"SETUSER", user, "reset", "on", ">pw", "resetkeys", "~redsem:*", "resetchannels", "-@all"}
		for _, c := range append(admin.ACLCommands(), extra...) {
			args = append(args, "+"+c)
		}
		srv.Do(t, "ACL", args...)
		return "redis://" + user + ":pw@" + srv.Addr
	}
	e := &env{srv: srv, url: setUser("cli"), dir: t.TempDir()}
	require.Equal(t, 0, e.run(t, "run", "--size", "2", "fleet", "--", "true").code)
	for _, args := range [][]string{{"top", "-n", "1"}, {"check", "--all"}} {
		r := e.run(t, args...)
		assert.Equal(t, exitUnavailable, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "NOPERM", "%v", args)
		assert.Contains(t, r.stderr, "allow +scan to this user", "%v", args)
	}
	p := startExporter(t, e.url)
	assert.Contains(t, p.scrape(t), "redsem_scrape_error 1")
	assert.Equal(t, 0, p.stop(t))
	failed := filterLines(p.lines(), "failed")
	require.Len(t, failed, 1, "%q", p.lines())
	assert.Contains(t, failed[0], "allow +scan to this user")

	e.url = setUser("cli-scan", "scan")
	r := e.run(t, "check", "--all", "-v")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "1 name under \"redsem:\" checked, all healthy\n", r.stdout)
	r = e.run(t, "top", "-n", "1")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "fleet ")
}

// The operators' ACL line of docs/production.md is admin.ACLCommands() with
// +info and +scan, and as that user every operators' command runs: check
// --server, the fleet view, and the commands on one name.
func TestOperatorsACLLineOfTheDocs(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "production.md"))
	require.NoError(t, err)
	line := regexp.MustCompile(`(?m)^ACL SETUSER redsem-ops .*$`).FindString(string(page))
	require.NotEmpty(t, line, "docs/production.md has the operators' ACL line")
	var args, cmds []interface{}
	for _, f := range strings.Fields(line)[1:] {
		if f == ">secret" {
			f = ">pw"
		}
		args = append(args, f)
		if strings.HasPrefix(f, "+") {
			cmds = append(cmds, strings.TrimPrefix(f, "+"))
		}
	}
	var want []interface{}
	for _, c := range append(admin.ACLCommands(), "info", "scan") {
		want = append(want, c)
	}
	assert.ElementsMatch(t, want, cmds, "the operators' line: ACLCommands, +info and +scan")

	srv := redistest.Start(t)
	srv.Do(t, "ACL", args...)
	e := &env{srv: srv, url: "redis://redsem-ops:pw@" + srv.Addr, dir: t.TempDir()}
	for _, tc := range []struct {
		args []string
		out  string
	}{
		{[]string{"check", "--server"}, "fit for redsem"},
		{[]string{"resize", "--create", "ops", "2"}, "created semaphore"},
		{[]string{"run", "--size", "2", "ops", "--", "true"}, ""},
		{[]string{"status", "ops"}, "size       2"},
		{[]string{"top", "-n", "1"}, "ops "},
		{[]string{"check", "--all", "-v"}, "1 name under"},
		{[]string{"resize", "ops", "3"}, "3 slot(s)"},
	} {
		r := e.run(t, tc.args...)
		assert.Equal(t, 0, r.code, "%v: %s", tc.args, r.stderr)
		assert.Contains(t, r.stdout, tc.out, "%v", tc.args)
	}
}
