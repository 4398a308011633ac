//go:build unix

package main

import (
	"crypto/tls"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
)

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		url, network, addr, shown string
	}{
		{"redis://10.0.0.1:7000/3", "tcp", "10.0.0.1:7000", "redis://10.0.0.1:7000/3"},
		{"redis://:secret@h/1", "tcp", "h:6379", "redis://:xxxxx@h/1"},
		{"redis://user:secret@h:1?db=2", "tcp", "h:1", "redis://user:xxxxx@h:1?db=2"},
		{"rediss://h:6380", "tcp", "h:6380", "rediss://h:6380"},
		{"h:6000", "tcp", "h:6000", "redis://h:6000"},
		{"redis://", "tcp", "127.0.0.1:6379", "redis:"},
		{"redis://[::1]:7000", "tcp", "[::1]:7000", "redis://[::1]:7000"},
		{"unix:///run/redis.sock?db=4&password=pw", "unix", "/run/redis.sock", "unix:///run/redis.sock?db=4&password=xxxxx"},
	} {
		tg, err := parseTarget(tc.url, connFlags{})
		require.NoError(t, err, tc.url)
		assert.Equal(t, tc.network, tg.network, tc.url)
		assert.Equal(t, tc.addr, tg.addr, tc.url)
		assert.Equal(t, tc.shown, tg.shown, tc.url)
	}
	for _, bad := range []string{"ftp://h", "redis://h/x", "redis://h/1?db=2", "unix://", "redis://h?db=-1", "redis://%zz"} {
		_, err := parseTarget(bad, connFlags{})
		assert.Equal(t, exitUsage, codeFor(err), "%s: %v", bad, err)
	}
	_, err := parseTarget("redis://h", connFlags{insecure: true})
	assert.Equal(t, exitUsage, codeFor(err), "--insecure without rediss")
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"0": 0, "1.5": 1500 * time.Millisecond, "90": 90 * time.Second, "250ms": 250 * time.Millisecond, "2m": 2 * time.Minute,
	} {
		got, err := parseDuration(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "-1", "-1s", "soon", "1e99"} {
		_, err := parseDuration(bad)
		assert.Error(t, err, bad)
	}
}

// Password and database from redis:// and unix:// URLs reach the server:
// the keys land in the database the URL names.
func TestConnectPasswordDatabaseUnix(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "r.sock")
	srv := redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700")
	srv.Do(t, "CONFIG", "SET", "requirepass", "pw") // after Start, whose readiness PING has no password
	e := &env{srv: srv, dir: t.TempDir()}

	for _, url := range []string{
		"redis://:pw@" + srv.Addr + "/5",
		"redis://" + srv.Addr + "?db=5&password=pw",
		"unix://" + sock + "?db=5&password=pw",
		"unix://:pw@" + sock + "?db=5",
	} {
		e.url = url
		r := e.run(t, "run", "--size", "2", "db5", "--", "true")
		assert.Equal(t, 0, r.code, "%s: %s", url, r.stderr)
	}
	c, err := redis.Dial("tcp", srv.Addr, redis.DialPassword("pw"), redis.DialDatabase(5))
	require.NoError(t, err)
	defer c.Close()
	keys, err := redis.Strings(c.Do("KEYS", "redsem:*"))
	require.NoError(t, err)
	assert.NotEmpty(t, keys, "the semaphore lives in db 5")

	e.url = "redis://:wrong@" + srv.Addr + "/5"
	r := e.run(t, "status", "db5")
	assert.Equal(t, exitUnavailable, r.code)
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"), r.stderr)
	assert.NotContains(t, r.stderr, "wrong", "no password in messages")
}

// rediss:// with --cacert verifies the server; without it an unknown CA
// fails, and --insecure skips the check. The TLS server is miniredis.
func TestConnectTLS(t *testing.T) {
	t.Parallel()
	certs := redistest.NewTLS(t)
	cert, err := tls.LoadX509KeyPair(certs.CertFile, certs.KeyFile)
	require.NoError(t, err)
	caFile := certs.CAFile
	m, err := miniredis.RunTLS(&tls.Config{Certificates: []tls.Certificate{cert}})
	require.NoError(t, err)
	t.Cleanup(m.Close)
	e := &env{url: "rediss://" + m.Addr(), dir: t.TempDir()}

	r := e.run(t, "status", "--cacert", caFile, "tls")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "does not exist")
	r = e.run(t, "status", "--insecure", "tls")
	assert.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "status", "tls")
	assert.Equal(t, exitUnavailable, r.code)
	assert.Contains(t, r.stderr, "certificate")
}

// TestConnectionHelpNamesEveryURLForm: the Connection section of every
// command's help names each form of --redis that connect takes.
func TestConnectionHelpNamesEveryURLForm(t *testing.T) {
	for _, form := range []string{"host:port", "redis://", "rediss://", "unix://", "redis+sentinel://", "rediss+sentinel://"} {
		assert.True(t, strings.Contains(connHelp, form), "the Connection section of --help does not name %s", form)
		assert.True(t, strings.Contains(runHelp, form), "run --help does not name %s", form)
	}
}
