package redsem

import (
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// No script is hashed on the client (Go's FIPS 140-only mode forbids
// SHA-1): a script's first run learns its hash from Redis (SCRIPT LOAD),
// every run goes by EVALSHA, and a server that lost its scripts (SCRIPT
// FLUSH, a restart) answers NOSCRIPT and gets the script again by EVAL.
// .ci/run runs this test under GODEBUG=fips140=only, with a full acquire
// and release.
func TestScripts_hashFromRedis(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := b.pool.Get()
	defer c.Close()
	script := engine.Lua(1, "return redis.call('GET', KEYS[1]) or 'none' -- "+t.Name())
	require.Empty(t, script.Hash(), "no hash before Redis gave one")
	v, err := redis.String(script.Do(c, "k"))
	require.NoError(t, err)
	assert.Equal(t, "none", v)
	require.Len(t, script.Hash(), 40)
	calls := b.srv.CommandCalls(t)
	assert.Equal(t, 1, calls["script|load"], "the hash, from SCRIPT LOAD: %v", calls)
	assert.Equal(t, 1, calls["evalsha"], "%v", calls)
	assert.Zero(t, calls["eval"], "%v", calls)

	b.do(t, "SCRIPT", "FLUSH")
	b.do(t, "SET", "k", "v")
	v, err = redis.String(script.Do(c, "k"))
	require.NoError(t, err)
	assert.Equal(t, "v", v)
	calls = b.srv.CommandCalls(t)
	assert.Equal(t, 1, calls["eval"], "NOSCRIPT, then EVAL: %v", calls)
	assert.Equal(t, 1, calls["script|load"], "the hash is kept: %v", calls)
	exists, err := redis.Ints(b.do(t, "SCRIPT", "EXISTS", script.Hash()), nil)
	require.NoError(t, err)
	assert.Equal(t, []int{1}, exists, "EVAL loaded it again under the same hash")

	s := newSem(t, b, "scripts", 1)
	for _, when := range []string{"fresh server", "after SCRIPT FLUSH"} {
		l, err := s.Acquire(ctx)
		require.NoError(t, err, when)
		require.NoError(t, l.Release(ctx), when)
		requireInventory(t, s, 1, 0)
		b.do(t, "SCRIPT", "FLUSH")
	}
}
