package admin

import (
	"errors"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckServerNotChecked: a user without +info (the documented
// least-privilege ACL) gets ErrNotChecked, never a nil that reads as
// "checked and fine"; the same user with +info gets the real check.
func TestCheckServerNotChecked(t *testing.T) {
	b := realRedis(t)
	ctx := ctxT(t, 10*time.Second)
	b.do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	defer b.do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	rule := []interface{}{"SETUSER", "no-info", "on", ">pw", "resetkeys", "~redsem:*", "resetchannels", "-@all"}
	for _, c := range ACLCommands() {
		rule = append(rule, "+"+c)
	}
	b.do(t, "ACL", rule...)
	pool := b.srv.Pool(t, redis.DialUsername("no-info"), redis.DialPassword("pw"))
	err := CheckServer(ctx, pool)
	require.ErrorIs(t, err, ErrNotChecked)
	assert.False(t, errors.Is(err, ErrEvictingServer))
	var re redis.Error
	assert.True(t, errors.As(err, &re), "the server's refusal is wrapped too: %v", err)
	assert.Contains(t, err.Error(), "NOPERM")

	b.do(t, "ACL", "SETUSER", "no-info", "+info|server") // INFO server only, not memory
	assert.ErrorIs(t, CheckServer(ctx, pool), ErrNotChecked, "half a check is no check")
	b.do(t, "ACL", "SETUSER", "no-info", "+info")
	assert.ErrorIs(t, CheckServer(ctx, pool), ErrEvictingServer)
}
