package admin

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckServer(t *testing.T) {
	b := realRedis(t)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, CheckServer(ctx, b.pool))
	for _, p := range []string{"allkeys-lru", "allkeys-lfu", "allkeys-random"} {
		b.do(t, "CONFIG", "SET", "maxmemory-policy", p)
		assert.ErrorIs(t, CheckServer(ctx, b.pool), ErrEvictingServer, p)
	}
	for _, p := range []string{"volatile-lru", "noeviction"} {
		b.do(t, "CONFIG", "SET", "maxmemory-policy", p)
		assert.NoError(t, CheckServer(ctx, b.pool), p)
	}
}

func TestVersionBelow(t *testing.T) {
	assert.True(t, versionBelow("6.0.16", 6, 2))
	assert.True(t, versionBelow("5.0.0", 6, 2))
	assert.False(t, versionBelow("6.2.0", 6, 2))
	assert.False(t, versionBelow("7.0.15", 6, 2))
	assert.False(t, versionBelow("garbage", 6, 2))
}
