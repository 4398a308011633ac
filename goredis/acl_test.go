package goredis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/goredis"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// TestACLUser: a go-redis client logged in as a user allowed only
// goredis.ACLCommands (admin.ACLCommands plus the CLIENT|ID and
// CLIENT|UNBLOCK the adapter adds) runs redsem, and a cancelled wait is unblocked at once.
func TestACLUser(t *testing.T) {
	s := redistest.Start(t)
	rule := []interface{}{"ACL", "SETUSER", "app", "on", ">secret", "resetkeys", "~redsem:*",
		"resetchannels", "-@all"}
	for _, c := range goredis.ACLCommands() {
		rule = append(rule, "+"+c)
	}
	s.Do(t, rule[0].(string), rule[1:]...)
	rc := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "app", Password: "secret", MaintNotificationsConfig: noMaint()})
	t.Cleanup(func() { rc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sem, err := redsem.NewSemaphore(newPool(t, rc), "acl", 1, redsem.WithWaitConnections(0))
	require.NoError(t, err)
	held, err := sem.Acquire(ctx)
	require.NoError(t, err)
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := sem.Acquire(wctx)
		done <- err
	}()
	waitBlocked(t, s, 1)
	wcancel()
	require.ErrorIs(t, <-done, context.Canceled)
	waitBlocked(t, s, 0) // unblocked, not left to its timeout
	require.NoError(t, held.Release(ctx))
	l, err := sem.AcquireN(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	g, err := rate.New(newPool(t, rc), "acl", 1, time.Second)
	require.NoError(t, err)
	_, err = g.Wait(ctx)
	require.NoError(t, err)

	// Nothing was refused along the way.
	log := s.Do(t, "ACL", "LOG")
	entries, _ := log.([]interface{})
	var refused []string
	for _, e := range entries {
		f, _ := e.([]interface{})
		for i := 0; i+1 < len(f); i += 2 {
			if k, _ := f[i].([]byte); string(k) == "object" {
				v, _ := f[i+1].([]byte)
				refused = append(refused, string(v))
			}
		}
	}
	assert.Empty(t, refused, "commands refused: %s", strings.Join(refused, ", "))
}
