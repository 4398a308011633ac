package goredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/goredis"
	"github.com/redsem/redsem/internal/behaviour"
	"github.com/redsem/redsem/internal/redistest"
)

// newClient returns a go-redis client of a redis-server started for the
// test, speaking protocol (2 or 3; 0: go-redis's default, 3).
func newClient(t *testing.T, protocol int) (*redis.Client, *redistest.Server) {
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: protocol, MaintNotificationsConfig: noMaint()})
	t.Cleanup(func() { c.Close() })
	return c, s
}

// noMaint turns off go-redis's maintenance notifications. redis-server 7
// refuses their RESP3 handshake, and go-redis (v9.18 to v9.23) then writes
// the client's Options under the lock of whichever client or pinned Conn
// made the connection, while the pinned Conns the adapter uses (so that no
// command is ever re-sent) share those Options under locks of their own:
// two new connections of one node made at once are a race inside go-redis
// that -race reports. The tests turn the handshake off so that -race
// reports redsem's own races; docs/go-redis.md tells users to do the same
// on Redis before 8.
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
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
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaintNotificationsConfig: noMaint()})
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
