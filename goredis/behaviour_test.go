package goredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/goredis"
	"github.com/redsem/redsem/internal/behaviour"
	"github.com/redsem/redsem/internal/redistest"
)

// newClient returns a go-redis client of a redis-server started for the
// test, speaking protocol (2 or 3; 0: go-redis's default, 3).
func newClient(t *testing.T, protocol int) (*redis.Client, *redistest.Server) {
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: protocol})
	t.Cleanup(func() { c.Close() })
	return c, s
}

func newPool(t *testing.T, c redis.UniversalClient) *goredis.Pool {
	p, err := goredis.New(c)
	require.NoError(t, err)
	return p
}

// TestBehaviourClient holds a go-redis *redis.Client, in its default RESP3,
// to the whole behaviour suite.
func TestBehaviourClient(t *testing.T) {
	c, _ := newClient(t, 0)
	behaviour.Run(t, behaviour.Target{Pool: newPool(t, c)})
}

// TestBehaviourClientRESP2 does the same over RESP2 (Options.Protocol 2).
func TestBehaviourClientRESP2(t *testing.T) {
	c, _ := newClient(t, 2)
	behaviour.Run(t, behaviour.Target{Pool: newPool(t, c)})
}

// TestBehaviourCluster holds a *redis.ClusterClient on a three-master Redis
// Cluster to the suite.
func TestBehaviourCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { c.Close() })
	behaviour.Run(t, behaviour.Target{
		Pool: newPool(t, c),
		FlushScripts: func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				return n.ScriptFlush(ctx).Err()
			}))
		},
		Blocked: func(t *testing.T, key string) int {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			n, err := c.MasterForKey(ctx, key)
			require.NoError(t, err)
			info, err := n.Info(ctx, "clients").Result()
			require.NoError(t, err)
			return behaviour.BlockedClients(info)
		},
	})
}
