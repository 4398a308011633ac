//go:build unix

package main

import (
	"context"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/rate"
)

// rate set creates a gate or changes its limits for every client; a client
// made with another rate follows; bad limits are usage errors, another
// number of limits is the gate's state (65).
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
	require.Equal(t, 0, r.code, r.stderr)
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
}
