//go:build unix

package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/rate"
)

// rate set changes a gate's limits for every client, and creates one only
// with --create, beside another kind too; a client made with another rate
// follows; bad limits are usage errors, another number of limits is the
// gate's state (65).
func TestRateSet(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", e.srv.Addr, redis.DialDatabase(2)) }}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	g, err := rate.New(pool, "partner", 100, time.Second)
	require.NoError(t, err)
	_, err = g.AllowN(ctx, 60)
	require.NoError(t, err)
	r := e.run(t, "rate", "set", "partner", "50/1s")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "\"partner\" now admits 50 per 1s\n", r.stdout)
	_, err = g.Allow(ctx)
	require.ErrorIs(t, err, rate.ErrRateLimited, "60 units in the window, 50 allowed")
	st, err := g.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, 50, st.Limit)
	assert.True(t, st.Set)

	r = e.run(t, "rate", "set", "llm", "500/1m", "300000/1m")
	assert.Equal(t, exitNoName, r.code, "a typo makes no gate: %s", r.stderr)
	assert.Equal(t, "redsem: rate set: no rate gate \"llm\" under prefix \"redsem:\" (rate set --create llm 500/1m 300000/1m makes one)\n", r.stderr)
	keys, err := redis.Strings(pool.Get().Do("KEYS", "*llm*"))
	require.NoError(t, err)
	assert.Empty(t, keys, "a refused rate set writes nothing")
	r = e.run(t, "rate", "set", "--create", "llm", "500/1m", "300000/1m")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "created rate gate \"llm\", which admits 500 per 1m and 300000 per 1m\n", r.stdout)
	st, err = rate.ReadStatus(ctx, pool, rate.DefaultPrefix, "llm")
	require.NoError(t, err)
	assert.Equal(t, []rate.Limit{{N: 500, Per: time.Minute}, {N: 300000, Per: time.Minute}},
		[]rate.Limit{st.Limits[0].Limit, st.Limits[1].Limit})

	for _, bad := range [][]string{{"rate", "set", "x"}, {"rate", "get", "x", "1/1s"}, {"rate", "set", "x", "5"},
		{"rate", "set", "x", "0/1s"}, {"rate", "set", "x", "5/0s"}} {
		r = e.run(t, bad...)
		assert.Equal(t, 64, r.code, "%v: %s", bad, r.stderr)
	}
	r = e.run(t, "rate", "set", "llm", "500/1m")
	assert.Equal(t, 65, r.code, "a quota of two limits set with one: %s", r.stderr)
	assert.Contains(t, r.stderr, "500 per 1m and 300000 per 1m in Redis")

	// Beside a lock: refused (65) unless --create, then both are there.
	r = e.run(t, "resize", "--create", "jobs", "2")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "rate", "set", "jobs", "5/s")
	assert.Equal(t, exitData, r.code, r.stderr)
	assert.Equal(t, "redsem: rate set: \"jobs\" is a semaphore: it has no rate gate (rate set --create jobs 5/s makes one beside it)\n", r.stderr)
	r = e.run(t, "status", "--json", "jobs")
	assert.Contains(t, r.stdout, `"kinds": [
    "semaphore"
  ]`, "a refused rate set made no gate")
	r = e.run(t, "rate", "set", "--create", "jobs", "5/s")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "status", "jobs")
	assert.Contains(t, r.stdout, `"jobs" also names a rate gate (--kind rate)`)
	r = e.run(t, "rate", "status", "--create", "jobs")
	assert.Equal(t, exitUsage, r.code, "--create is for rate set")
}

// Every view of a gate says the same "available": what the next start can
// take, counting the units whose window has passed but that no script has
// let go yet.
func TestRateAvailableOneNumber(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := fleetPool(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := rate.New(pool, "burst", 5, 20*time.Millisecond)
	require.NoError(t, err)
	_, err = g.AllowN(ctx, 5)
	require.NoError(t, err)
	// Status writes nothing: the five stay due until the next start.
	waitFor(t, 10*time.Second, "the five starts are due", func() bool {
		st, err := g.Status(ctx)
		return err == nil && st.Due == 5
	})

	r := e.run(t, "rate", "status", "burst")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "available  5 now\n", "rate status")
	r = e.run(t, "check", "burst")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "due 5, available 5,", "check")
	for _, args := range [][]string{{"rate", "status", "--json", "burst"}, {"status", "--json", "burst"}} {
		r = e.run(t, args...)
		require.Equal(t, 0, r.code, r.stderr)
		var doc rateStatusJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
		assert.Equal(t, [2]int{5, 5}, [2]int{doc.Available, doc.Limits[0].Available}, "%v", args)
	}
	r = e.run(t, "top", "-n", "1", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var fl struct {
		Names []rateStatusJSON `json:"names"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &fl), r.stdout)
	require.Len(t, fl.Names, 1)
	assert.Equal(t, 5, fl.Names[0].Available, "top --json")

	_, err = g.AllowN(ctx, 5)
	require.NoError(t, err, "the next start takes all five")
}
