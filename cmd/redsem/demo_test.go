//go:build unix

package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var maxLine = regexp.MustCompile(`max concurrency\s+(\d+) of size (\d+)`)

// checkDemo checks a demo's output: plain lines, a summary whose max
// concurrency is the size (reached, never passed).
func checkDemo(t *testing.T, r result, size int) {
	t.Helper()
	require.Equal(t, 0, r.code, "stderr %s\nstdout %s", r.stderr, r.stdout)
	assert.NotContains(t, r.stdout, "\x1b[", "no terminal escapes without a TTY")
	assert.Contains(t, r.stdout, "holds slot")
	m := maxLine.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	most, _ := strconv.Atoi(m[1])
	k, _ := strconv.Atoi(m[2])
	assert.Equal(t, size, k)
	assert.LessOrEqual(t, most, size)
	assert.Equal(t, size, most, "6 workers on 2 slots fill both")
	assert.Contains(t, r.stdout, "12 distinct of 12")
}

func TestDemoEmbeddedWithoutTTY(t *testing.T) {
	t.Parallel()
	e := &env{url: "redis://127.0.0.1:1", dir: t.TempDir()} // REDIS_URL must not matter
	r := e.run(t, "demo", "--workers", "6", "--size", "2", "--work", "60ms", "--rounds", "2")
	checkDemo(t, r, 2)
	assert.Contains(t, r.stdout, "embedded miniredis")
}

func TestDemoAgainstRealRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(t, "demo", "--redis", e.url, "--workers", "6", "--size", "2", "--work", "60ms", "--rounds", "2")
	checkDemo(t, r, 2)
	c, err := redis.Dial("tcp", e.srv.Addr, redis.DialDatabase(2))
	require.NoError(t, err)
	defer c.Close()
	keys, err := redis.Strings(c.Do("KEYS", "*"))
	require.NoError(t, err)
	assert.Empty(t, keys, "the demo deletes its keys")
	assert.Contains(t, r.stdout, e.url, "the header names the server")
}
