//go:build unix

package main

import (
	"strings"
	"testing"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
)

func TestParseSentinelTarget(t *testing.T) {
	for _, tc := range []struct {
		url, master, shown string
		addrs              []string
		data, sentinel     int // dial options beyond none
	}{
		{"redis+sentinel://h1:26380,h2/mymaster", "mymaster", "redis+sentinel://h1:26380,h2/mymaster",
			[]string{"h1:26380", "h2:26379"}, 0, 0},
		{"redis+sentinel://:pw@[::1]:5000/m/3?sentinel_password=spw", "m",
			"redis+sentinel://:xxxxx@[::1]:5000/m/3?sentinel_password=xxxxx", []string{"[::1]:5000"}, 2, 1},
		{"redis+sentinel://u:pw@h/m?db=2&sentinel_password=s&sentinel_username=su", "m",
			"redis+sentinel://u:xxxxx@h/m?db=2&sentinel_password=xxxxx&sentinel_username=su", []string{"h:26379"}, 3, 2},
		{"rediss+sentinel://h/m", "m", "rediss+sentinel://h/m", []string{"h:26379"}, 3, 3},
	} {
		tg, err := parseSentinelTarget(tc.url, connFlags{})
		require.NoError(t, err, tc.url)
		assert.Equal(t, tc.master, tg.master, tc.url)
		assert.Equal(t, tc.addrs, tg.addrs, tc.url)
		assert.Equal(t, tc.shown, tg.shown, tc.url)
		assert.Len(t, tg.dataOpts, tc.data, tc.url)
		assert.Len(t, tg.sentinelOpts, tc.sentinel, tc.url)
	}
	for _, bad := range []string{
		"redis+sentinel://h/", "redis+sentinel://h", "redis+sentinel://h,,i/m", "redis+sentinel://h:x/m",
		"redis+sentinel://h/m/x", "redis+sentinel://h/m/1?db=2", "redis+sentinel://h/m/1/2", "redis+sentinel://:%zz@h/m",
	} {
		_, err := parseSentinelTarget(bad, connFlags{})
		assert.Equal(t, exitUsage, codeFor(err), "%s: %v", bad, err)
	}
	_, err := parseSentinelTarget("redis+sentinel://h/m", connFlags{insecure: true})
	assert.Equal(t, exitUsage, codeFor(err), "--insecure without rediss+sentinel")
	assert.True(t, isSentinelURL("rediss+sentinel://h/m"))
	assert.False(t, isSentinelURL("redis://h"))
}

// A sentinel URL reaches the master the sentinel names, with the data
// nodes' password and database and the sentinel's own password; a wrong
// sentinel password fails as unavailable without showing it.
func TestConnectSentinel(t *testing.T) {
	t.Parallel()
	set := redistest.StartSentinels(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1, Password: "pw"})
	e := &env{dir: t.TempDir(), url: "redis+sentinel://:pw@" + set.Addrs()[0] + "/" + redistest.SentinelName + "/3?sentinel_password=pw"}
	r := e.run(t, "run", "--size", "2", "through-sentinel", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	keys, err := redis.Strings(set.Do(set.Master(), "EVAL", "redis.call('SELECT', 3) return redis.call('KEYS', 'redsem:*')", 0))
	require.NoError(t, err)
	assert.NotEmpty(t, keys, "the semaphore lives in db 3 of the master")

	r = e.run(t, "status", "through-sentinel")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "through-sentinel")

	e.url = strings.Replace(e.url, "sentinel_password=pw", "sentinel_password=wrong", 1)
	r = e.run(t, "status", "through-sentinel")
	assert.Equal(t, exitUnavailable, r.code, r.stderr)
	assert.NotContains(t, r.stderr, "wrong", "no password in messages")
	assert.Contains(t, r.stderr, "xxxxx")
}
